"""Build the one native extension; everything else is in pyproject.toml.

`odradek.protocol._records` walks the records of a RecordBatch without per-record Python work
(see its C source). `pip install -e .` (what `./dev setup` runs) builds it in place with the
machine's C compiler and Python headers.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "odradek.protocol._records",
            sources=["src/odradek/protocol/_records.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=vla"],
        )
    ]
)
