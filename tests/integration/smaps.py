"""A mapping's own lines of /proc/self/smaps, for the tests of populated and huge-page mappings."""

from familyd import shard as fshard


def mapping_fields(mm):
    """The /proc/self/smaps fields (kB) of the mapping mm (an mmap object), by name."""
    addr = fshard._address(mm)
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            words = line.split()
            head = words[0]
            if "-" in head and ":" not in head:
                inside = int(head.split("-")[0], 16) == addr
            elif inside and head.endswith(":") and len(words) >= 2:
                try:
                    fields[head[:-1]] = int(words[1])
                except ValueError:
                    pass
    return fields


def resident_kib(mm):
    """Rss of the mapping mm plus its hugetlb pages (which Rss leaves out), in kB."""
    f = mapping_fields(mm)
    return f.get("Rss", 0) + f.get("Shared_Hugetlb", 0) + f.get("Private_Hugetlb", 0)
