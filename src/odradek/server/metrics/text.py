"""The Prometheus text of the broker's families, byte for byte as prometheus_client's encoders write
it (`generate_latest`, the text format 0.0.4; `openmetrics.generate_latest`, what a Prometheus
server asks for by default), for a fraction of their CPU (HTTP threads, off the event loop).

Where `generate_latest` spent a full scrape's time: per sample, sorting and escaping the labels
(a regular expression per label name, a character-by-character escape per value) and formatting
the line; per family, escaping the name twice. Yet from one scrape to the next the families and
their label sets hardly change: only the values do. So a `TextFormat` (one per encoder) keeps

* each family's comment lines (`# HELP ...`, `# TYPE ...`), by (name, type, help);
* each sample's `name{label="value",...}`, by (name, label items);

and a line is then a cached prefix, a space and the value (`floatToGoString`, as both encoders
format it); the last line of each sample is kept with its value, and written again as it is while
the value is the same object (a counter nobody bumped, a timer's kept summary: identity, not
equality, so that 0 and 0.0 or -0.0 never share a line). A cache miss is filled by the encoder
itself, on a family of that one sample: whatever its escaping does, the cached text is its own,
and the output stays identical (`tests/unit/test_metrics_text.py` checks it against both
encoders). A family this fast path does not cover (a type other than gauge or untyped, a unit, a
timestamp or exemplar, a sample named apart from its family, such as a counter's `_created`) is
written by the encoder whole.

The sample cache is bounded (`MAX_SAMPLES`, then emptied: topics, groups and partitions come and
go); filling it again costs one scrape the old price.

Concurrency: `render` may run on several HTTP threads at once; the caches are dicts read and
written one item at a time (atomic under the GIL), and two threads filling the same key write the
same text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# Far more distinct samples than one broker serves (62 hosted replicas and 15 APIs: ~1,000).
MAX_SAMPLES = 200_000

# The family types written here; the others are the encoder's (it renames counters, etc.).
_PLAIN_TYPES = frozenset({"gauge", "unknown"})


class RowFamily(Metric):
    """A gauge or untyped family given as rows of (label values, value), whose `samples` are
    made only if someone reads them: `TextFormat` writes the rows as they are. For the families
    with many samples, built anew at every scrape (the timers', about two thirds of a broker's
    samples, and the per-replica gauges): a row is one tuple, a sample a tuple and a dict."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: tuple[str, ...],
        rows: list[tuple[tuple[str, ...], float]],
        typ: str = "unknown",
    ) -> None:
        if typ not in _PLAIN_TYPES:
            raise ValueError(f"a RowFamily is a gauge or untyped, not {typ}")
        super().__init__(name, documentation, typ)
        self.label_names = label_names
        self.rows: list[tuple[tuple[str, ...], float]] | None = rows
        self._samples: list[Sample] | None = None

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            names = self.label_names
            self._samples = [
                Sample(self.name, dict(zip(names, labels, strict=True)), value, None)
                for labels, value in self.rows or ()
            ]
        return self._samples

    @samples.setter
    def samples(self, samples: list[Sample]) -> None:
        # Given samples replace the rows (Metric's constructor gives an empty list).
        self._samples = samples
        self.rows = None


class _Families:
    """A collector of given families, to hand `generate_latest`."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


# prometheus_client's encoders: a collector's families -> their text.
Encoder = Callable[[Any], bytes]


class TextFormat:
    """Writes families as `encoder` (`generate_latest`, `openmetrics.generate_latest`, or one of
    their partials with an escaping) does (see the module docstring)."""

    def __init__(self, encoder: Encoder = generate_latest, max_samples: int = MAX_SAMPLES) -> None:
        self._encoder = encoder
        # What the encoder writes after the families (OpenMetrics' `# EOF`).
        self._trailer = encoder(_Families([])).decode()
        self._headers: dict[tuple[str, str, str], str] = {}
        # (name, label items) -> (`name{labels}`, the last value written, its line)
        # and (name, label names, label values) of a `RowFamily` -> the same
        self._lines: dict[tuple[Any, ...], tuple[str, object, str]] = {}
        self._max_samples = max_samples

    def render(self, families: Iterable[Metric]) -> bytes:
        output: list[str] = []
        append = output.append
        lines = self._lines
        for family in families:
            name = family.name
            keyed: Iterator[tuple[tuple[Any, ...], Any, Any]]
            if isinstance(family, RowFamily) and family.rows is not None:
                label_names = family.label_names
                keyed = (((name, label_names, row), row, value) for row, value in family.rows)
            elif (
                family.type in _PLAIN_TYPES
                and not family.unit
                and all(
                    s.name == name
                    and s.timestamp is None
                    and s.exemplar is None
                    and s.native_histogram is None
                    for s in family.samples
                )
            ):
                keyed = (
                    ((name, tuple(s.labels.items())), s.labels, s.value) for s in family.samples
                )
            else:
                append(self._generate(family))
                continue
            append(self._header(family))
            for key, labels, value in keyed:
                cached = lines.get(key)
                if cached is not None and cached[1] is value:
                    append(cached[2])
                    continue
                prefix = cached[0] if cached is not None else self._prefix(family, labels)
                line = f"{prefix} {floatToGoString(value)}\n"
                if len(lines) >= self._max_samples:
                    lines.clear()
                lines[key] = (prefix, value, line)
                append(line)
        append(self._trailer)
        return "".join(output).encode()

    def _generate(self, family: Metric) -> str:
        """The encoder's text of `family` alone."""
        text = self._encoder(_Families([family])).decode()
        return text[: len(text) - len(self._trailer)]

    def _header(self, family: Metric) -> str:
        key = (family.name, family.type, family.documentation)
        header = self._headers.get(key)
        if header is None:
            empty = Metric(family.name, family.documentation, family.type)
            # (Metric's constructor may have changed the name: a counter's loses `_total`.)
            empty.name = family.name
            header = self._headers[key] = self._generate(empty)
        return header

    def _prefix(self, family: Metric, labels: dict[str, str] | tuple[str, ...]) -> str:
        """`name{labels}` as the encoder writes it (`labels`: a sample's, or a row's values)."""
        if not isinstance(labels, dict):
            labels = dict(zip(family.label_names, labels, strict=True))  # type: ignore[attr-defined]
        alone = Metric(family.name, family.documentation, family.type)
        alone.name = family.name
        alone.samples = [Sample(family.name, labels, 0.0, None)]
        # The family's last line is `<prefix> 0.0`: the prefix is the encoder's own text.
        line = self._generate(alone).rsplit("\n", 2)[-2]
        return line[: -len(" 0.0")]
