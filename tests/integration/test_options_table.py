#!/usr/bin/python3
"""familyd's options are one table (daemon/config.c); nothing that lists them may drift from it.

(a) deploy/systemd/familyd.conf is byte for byte `familyd --print-config`;
(b) the usage block of docs/operating.md ("Running familyd") names exactly the options of
    `--help`,
    each synopsis in --help's order;
(c) every default that section states (its defaults table, the options it calls off unless
    given, and numbers it ties to an option in prose) is the one `--help` states;
(d) every key of familyd.conf, uncommented, is accepted: `familyd --check-config` passes.

Each check is a function returning its problems; TestChecksCatchDrift feeds them drifted copies
of docs/operating.md and the example to show that each one fails when they drift.
"""

import difflib
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
OPERATING = os.path.join(H.SOURCE_ROOT, "docs", "operating.md")
EXAMPLE = os.path.join(H.SOURCE_ROOT, "deploy", "systemd", "familyd.conf")

# The column where --help's sentences start.
HELP_TEXT_COLUMN = 28

# Options that take a value but act instead of setting something: no config file key, no
# default (--config reads its file, --check-registry checks its directory and exits).
ACTING_WITH_VALUE = ("config", "check-registry")


def run(*args, timeout=30):
    return subprocess.run([H.familyd_bin(), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def read(path):
    with open(path) as f:
        return f.read()


class Option:
    def __init__(self, name, metavar, sentence):
        self.name, self.metavar, self.sentence = name, metavar, sentence

    @property
    def default(self):
        """What "(default ...)" at the end of the sentence says, or None."""
        m = re.search(r"\(default(?:: | )(.*)\)$", self.sentence)
        return m.group(1) if m else None

    def __repr__(self):
        return "--%s %s: %s" % (self.name, self.metavar or "", self.sentence)


def parse_help(text):
    """The option rows of --help in order: name, metavar and the sentence on one line."""
    options = []
    started = False
    for line in text.splitlines():
        m = re.match(r"^(?:  -\w |     )--([a-z][a-z0-9-]*)(?: ([A-Z][A-Z:]*)(?=\s|$))?(.*)$",
                     line)
        if m:
            started = True
            options.append(Option(m.group(1), m.group(2), m.group(3).strip()))
        elif started and line.startswith(" " * HELP_TEXT_COLUMN) and line.strip():
            o = options[-1]
            o.sentence = (o.sentence + " " + line.strip()).strip()
        elif started:
            break
    return options


def running_section(doc):
    """The text of "## Running familyd", up to the next section."""
    m = re.search(r"^## Running familyd\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert m, "docs/operating.md has no section '## Running familyd'"
    return m.group(1)


def usage_block(section):
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", section, re.M | re.S):
        if block.startswith("familyd [--config FILE]"):
            return block
    return None


def usage_problems(doc, help_text):
    """(b): the usage block against --help."""
    block = usage_block(running_section(doc))
    if block is None:
        return ["no usage block starting `familyd [--config FILE]` under '## Running familyd'"]
    synopses = []
    for line in block.splitlines():
        if line.startswith("familyd"):
            synopses.append([])
        synopses[-1].extend(re.findall(r"(?<![\w-])--([a-z][a-z0-9-]*)", line))
    order = [o.name for o in parse_help(help_text)]
    problems = []
    listed = [name for synopsis in synopses for name in synopsis]
    for name in order:
        if listed.count(name) != 1:
            problems.append("--%s of --help is in the usage block %d times"
                            % (name, listed.count(name)))
    for name in listed:
        if name not in order:
            problems.append("--%s of the usage block is not in --help" % name)
    for synopsis in synopses:
        known = [n for n in synopsis if n in order]
        if known != sorted(known, key=order.index):
            problems.append("the synopsis %s is not in --help's order %s" % (synopsis, order))
    return problems


def defaults_table(section):
    """The rows of the table headed `| option | default |`: [(name, default)], or None."""
    m = re.search(r"^\| option \| default \|\n\|[-| ]+\|\n((?:\|.*\n?)*)", section, re.M)
    if not m:
        return None
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`--([a-z][a-z0-9-]*)`", cells[0])
        rows.append((name.group(1) if name else cells[0], cells[1].replace("`", "")))
    return rows


def prose_numbers(section):
    """Numbers the prose ties to an option: "256 in all (`--max-connections`" gives
    ("max-connections", "256", ""), "after 120 s without a call (`--connection-idle-ms`"
    ("connection-idle-ms", "120", "s"). Code blocks and tables left out."""
    prose = re.sub(r"^```.*?^```", "", section, flags=re.M | re.S)
    prose = re.sub(r"^\|.*$", "", prose, flags=re.M)
    found = []
    for m in re.finditer(r"(?<![\w.,])(\d[\d,]*)(?: (s|ms))?(?![\w,])[^\d().|`]{0,60}?"
                         r"\(`--([a-z][a-z0-9-]*)", prose):
        found.append((m.group(3), m.group(1).replace(",", ""), m.group(2) or ""))
    return found


def default_problems(doc, help_text):
    """(c): the defaults the section states against those of --help."""
    section = running_section(doc)
    options = parse_help(help_text)
    by_name = {o.name: o for o in options}
    problems = []

    rows = defaults_table(section)
    want = [(o.name, o.default) for o in options if o.default is not None]
    if rows is None:
        problems.append("no table headed `| option | default |` under '## Running familyd'")
    elif rows != want:
        problems.append("the defaults table differs from --help; as --help states them:\n"
                        + "\n".join("| `--%s` | %s |" % r for r in want))

    # Options that take a value, are not --config, and have no default: "off unless given".
    m = re.search(r"((?:`--[a-z][a-z0-9-]*`(?:, | and |,? ?\n)?)+) (?:is|are) off unless given",
                  section)
    off = re.findall(r"`--([a-z][a-z0-9-]*)`", m.group(1)) if m else None
    want_off = [o.name for o in options
                if o.metavar and o.default is None and o.name not in ACTING_WITH_VALUE]
    if off is None:
        problems.append("no sentence naming the options that are off unless given")
    elif off != want_off:
        problems.append("off unless given: docs/operating.md says %s, --help %s" % (off, want_off))

    for name, number, unit in prose_numbers(section):
        o = by_name.get(name)
        d = o and o.default and re.match(r"\d+", o.default)
        if not d:
            problems.append("docs/operating.md ties %s to --%s, which has no numeric default"
                            % (number, name))
            continue
        value = int(number) * (1000 if unit == "s" and name.endswith("-ms") else 1)
        if value != int(d.group(0)):
            problems.append("docs/operating.md says %s%s for --%s; --help's default is %s"
                            % (number, " " + unit if unit else "", name, o.default))
    return problems


def example_problems(example, printed):
    """(a): the shipped example against --print-config."""
    if example == printed:
        return []
    diff = difflib.unified_diff(example.splitlines(True), printed.splitlines(True),
                                "deploy/systemd/familyd.conf", "familyd --print-config")
    return ["deploy/systemd/familyd.conf is not `familyd --print-config`:\n" + "".join(diff)]


# A value for a key whose example line is empty, by the metavar --help gives it.
VALUE_FOR_METAVAR = {
    "N": "1",
    "NAME": "node-a",
    "ADDR:PORT": "127.0.0.1:7313",
    "LIST": "127.0.0.1:7314,127.0.0.1:7315",
    "BYTES": "1048576",
    "LEVEL": "info",
    "URL": "etcd://127.0.0.1:2379",
}

# The two ways to form a cluster exclude each other (--coordinator refuses --listen and
# --peers): the example is tried once without each side's keys.
CLUSTER_MODES = ({"coordinator", "cluster", "coordinator-ca", "coordinator-cert",
                  "coordinator-key"}, {"listen", "peers"})


def key_problems(example, help_text, tmp):
    """(d): every key of the example, uncommented, through `familyd --check-config`; the keys
    of one way to form a cluster at a time (CLUSTER_MODES)."""
    problems = []
    for n, leave_out in enumerate(CLUSTER_MODES):
        folder = os.path.join(tmp, "mode-%d" % n)
        os.makedirs(folder, exist_ok=True)
        problems += mode_key_problems(example, help_text, folder, leave_out)
    return sorted(set(problems), key=problems.index)


def mode_key_problems(example, help_text, tmp, leave_out):
    metavars = {o.name: o.metavar for o in parse_help(help_text)}
    lines, problems, keys = [], [], []
    for line in example.splitlines():
        m = re.match(r"^#([a-z][a-z0-9-]*) =(?: (.*))?$", line)
        if not m or m.group(1) in leave_out:
            lines.append(line)
            continue
        key, value = m.group(1), m.group(2)
        keys.append(key)
        if not value:
            metavar = metavars.get(key)
            if metavar in ("PATH", "DIR"):
                value = os.path.join(tmp, "path-for-" + key)
            else:
                value = VALUE_FOR_METAVAR.get(metavar)
            if value is None:
                problems.append("no value to try for key %s (metavar %s)" % (key, metavar))
                continue
            if key == "cluster-key":
                # The check reads the key file as a start does: a real one, mode 0600.
                fd = os.open(value, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.write(fd, (os.urandom(32).hex() + "\n").encode())
                os.close(fd)
        lines.append("%s = %s" % (key, value))
    if not keys:
        return ["no `#key = value` lines in the example"]
    conf = os.path.join(tmp, "uncommented.conf")
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    # The file is read in full; the flags (which win) keep the check off this machine's
    # /etc and /run.
    socket = os.path.join(tmp, "api.sock")
    r = run("--check-config", "--config", conf, "--registry", REGISTRY, "--socket", socket,
            "--shard-socket", os.path.join(tmp, "shard.sock"))
    if r.returncode != 0 or r.stderr.strip():
        problems.append("familyd --check-config refused the uncommented example (exit %d): %s"
                        % (r.returncode, r.stderr.strip()))
    if os.path.exists(socket):
        problems.append("--check-config bound the API socket")
    return problems


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        r = run("--help")
        assert r.returncode == 0, r.stderr
        cls.help = r.stdout
        cls.options = parse_help(cls.help)
        r = run("--print-config")
        assert r.returncode == 0, r.stderr
        cls.printed = r.stdout

    def setUp(self):
        self.tmp = H.short_tmpdir("fd-opts-")
        self.addCleanup(shutil.rmtree, self.tmp, True)


class OptionsTable(Base):
    def test_help_parses_into_every_option(self):
        names = [o.name for o in self.options]
        self.assertGreaterEqual(len(names), 25, self.help)
        for name in ("help", "version", "config", "socket", "log-level", "check-config"):
            self.assertIn(name, names)
        self.assertEqual(len(names), len(set(names)), names)
        # --print-config is for packaging: it works, but --help does not offer it.
        self.assertNotIn("print-config", names)
        self.assertNotIn("--print-config", self.help)

    def test_a_example_is_print_config(self):
        self.assertEqual(example_problems(read(EXAMPLE), self.printed), [])
        # Every key the example lists is a value-taking option of --help, and the other way
        # round (--config and --check-registry are not keys).
        keys = re.findall(r"^#([a-z][a-z0-9-]*) =", self.printed, re.M)
        self.assertEqual(keys, [o.name for o in self.options
                                if o.metavar and o.name not in ACTING_WITH_VALUE])

    def test_b_operating_usage_lists_the_options_of_help(self):
        self.assertEqual(usage_problems(read(OPERATING), self.help), [])

    def test_c_operating_defaults_are_those_of_help(self):
        doc = read(OPERATING)
        self.assertEqual(default_problems(doc, self.help), [])
        # The prose check has something to check.
        self.assertGreaterEqual(len(prose_numbers(running_section(doc))), 3)

    def test_d_every_key_of_the_example_is_accepted(self):
        self.assertEqual(key_problems(read(EXAMPLE), self.help, self.tmp), [])


class TestChecksCatchDrift(Base):
    """The checks above, on drifted copies: each must report it."""

    def drifted(self, text, old, new, count=1):
        self.assertIn(old, text)
        return text.replace(old, new, count)

    def test_a_catches_a_changed_example(self):
        printed = self.printed
        for old, new in (("#max-builds = 1024", "#max-builds = 2048"),
                         ("#threads = 2\n", "#threads = 2\n#no-such-key = 1\n"),
                         ("# Live builds", "# Builds")):
            with self.subTest(old=old):
                self.assertNotEqual(example_problems(self.drifted(printed, old, new), printed),
                                    [])
        self.assertNotEqual(example_problems(printed + "\n", printed), [])

    def test_b_catches_a_changed_usage_block(self):
        doc = read(OPERATING)
        self.assertEqual(usage_problems(doc, self.help), [])
        for old, new in (("[--max-builds N] ", ""),                       # an option missing
                         ("[--log-level LEVEL]", "[--log-level LEVEL] [--bogus N]"),  # unknown
                         ("[--heartbeat-ms N] [--suspect-ms N]",          # out of order
                          "[--suspect-ms N] [--heartbeat-ms N]"),
                         ("familyd --help | --version", "familyd --help")):
            with self.subTest(old=old):
                self.assertNotEqual(usage_problems(self.drifted(doc, old, new), self.help),
                                    [])
        # An option --help gains that docs/operating.md does not list.
        grown = self.help.replace(
            "     --version ", "     --frobnicate N         Frobnicate\n     --version ", 1)
        self.assertNotEqual(usage_problems(doc, grown), [])

    def test_c_catches_a_changed_default(self):
        doc = read(OPERATING)
        self.assertEqual(default_problems(doc, self.help), [])
        for old, new in (("| `--max-builds` | `1024` |", "| `--max-builds` | `2048` |"),
                         ("| `--threads` | `2` |\n", ""),
                         ("| `--node-name` | the host name |", "| `--node-name` | `localhost` |"),
                         ("`--listen` and `--peers` are off", "`--peers` are off"),
                         ("256 in all", "512 in all"),
                         ("closed after 120 s", "closed after 60 s"),
                         ("1,024 open Watch streams", "4,096 open Watch streams")):
            with self.subTest(old=old):
                self.assertNotEqual(default_problems(self.drifted(doc, old, new), self.help),
                                    [])
        # --help changing a default is caught the same way.
        changed = self.drifted(self.help, "Live builds (default 1024)",
                               "Live builds (default 4096)")
        self.assertNotEqual(default_problems(doc, changed), [])

    def test_d_catches_an_unknown_or_bad_key(self):
        example = read(EXAMPLE)
        for old, new in (("#threads = 2\n", "#threads = 2\n#no-such-key = 1\n"),
                         ("#threads = 2", "#threads = 0"),
                         ("#log-level = info", "#log-level = loud")):
            with self.subTest(old=old):
                problems = key_problems(self.drifted(example, old, new), self.help, self.tmp)
                self.assertNotEqual(problems, [])
                self.assertIn("uncommented.conf:", "\n".join(problems))


if __name__ == "__main__":
    unittest.main(verbosity=2)
