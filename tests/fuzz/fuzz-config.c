/* fuzz-config.c: a config file through config_parse(), as `familyd --config FILE` reads it. */

/*
 * config.c belongs to the systemd work; this harness only calls its public function with the
 * argv the daemon would get. Besides "no crash, no leak": a file that parses leaves every
 * derived setting filled and the failure-detector times ordered, as daemon_new() assumes.
 * Usage errors print one line each to stderr: that is the parser's behaviour, not a failure.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *fuzz_dir;
static char *fuzz_file;

static void cleanup(void) {
        if (fuzz_file)
                unlink(fuzz_file);
        if (fuzz_dir)
                rmdir(fuzz_dir);
        free(fuzz_file);
        free(fuzz_dir);
}

static void setup(void) {
        const char *tmp = getenv("TMPDIR");
        if (asprintf(&fuzz_dir, "%s/fuzz-config-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0)
                abort();
        if (!mkdtemp(fuzz_dir))
                abort();
        if (asprintf(&fuzz_file, "%s/familyd.conf", fuzz_dir) < 0)
                abort();
        atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!fuzz_dir)
                setup();

        FILE *f = fopen(fuzz_file, "we");
        if (!f)
                abort();
        if (size > 0 && fwrite(data, 1, size, f) != size)
                abort();
        if (fclose(f) != 0)
                abort();

        char *argv[] = { (char *) "familyd", (char *) "--config", fuzz_file, NULL };
        Config c = {};
        int r = config_parse(&c, 3, argv);
        if (r == CONFIG_RUN) {
                if (!c.socket_path || !c.shard_socket_path || !c.registry_path || !c.node_name ||
                    !c.config_file)
                        abort();
                if (c.suspect_ms < c.heartbeat_ms || c.down_ms < c.suspect_ms)
                        abort();
        } else if (r != -EINVAL && r != -ERANGE && r != -ENOMEM) {
                fprintf(stderr, "fuzz-config: config_parse returned %d\n", r);
                abort();
        }
        config_done(&c);
        return 0;
}
