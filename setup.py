"""Build the one native extension; everything else is in pyproject.toml.

`odradek.protocol._records` walks the records of a RecordBatch without per-record Python work;
`odradek.protocol._frames` checks the lengths in a request before kio decodes it;
`odradek.protocol._arrow` decodes records into Arrow columns and `odradek.protocol._encoder`
encodes Arrow columns into record batches (see their C sources). `pip install -e .` (what
`./dev setup` runs) builds them in place with the machine's C compiler and Python headers.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            f"odradek.protocol.{name}",
            sources=[f"src/odradek/protocol/{name}.c"],
            depends=[
                f"src/odradek/protocol/{h}"
                for h in (
                    "_walker.h",
                    "_crc32c.h",
                    "_arrow_buffers.h",
                    "_big_endian.h",
                    "_growable.h",
                    "_compaction.h",
                    "_offset_map.h",
                    "_index_builder.h",
                    "_compaction_passes.h",
                    "_murmur2.h",
                )
            ],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=vla"],
        )
        for name in ("_records", "_frames", "_compaction", "_arrow", "_encoder")
    ]
)
