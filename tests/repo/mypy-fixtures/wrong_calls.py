"""Wrongly typed calls of the familyd package: mypy must report each line marked "error"."""

import familyd


def main() -> None:
    c = familyd.Client(socket=3)                              # error: an int for the socket
    c.build("grouped_experts", seed="zero")                   # error: a str for the seed
    freed: str = c.release_build("bld-1")                     # error: release_build gives a bool
    c.release_build(42)                                       # error: an int for the build id
    familyd.fetch_shards("shard.sock", ["tok"], timeout="1")  # error: a str for the timeout
    e = familyd.ShardError("5", "no such token")              # error: a str for the code
    print(freed, e)
