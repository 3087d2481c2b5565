"""What ``cronlock bench`` measures and how much of it: parsed, checked, with ``--quick``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from cronlock.errors import ConfigurationError
from cronlock.queue.drainer import CommitMode

__all__ = [
    "QUICK",
    "SECTIONS",
    "BenchOptions",
    "bench_options",
    "parse_list",
    "parse_modes",
    "parse_sections",
    "parse_sizes",
]

SECTIONS = ("enqueue", "drain", "latency", "periodic", "recovery")
DEFAULT_SIZES = (100, 1_000, 10_000, 100_000)
MAX_SIZE = 10_000_000

T = TypeVar("T")


@dataclass(frozen=True)
class BenchOptions:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    modes: tuple[CommitMode, ...] = (CommitMode.STRICT, CommitMode.BATCH)
    batch_size: int | None = None
    enqueue_bulk: int = 10_000
    enqueue_single: int = 1_000
    latency_rate: float = 50.0
    latency_seconds: float = 10.0
    items: int = 10_000
    recovery_kills: int = 3
    repeats: int = 1
    sections: tuple[str, ...] = SECTIONS
    fail_at: str | None = None  # a hidden hook: fail this section (tests of the cleanup)

    def to_dict(self) -> dict[str, Any]:
        answer = asdict(self)
        answer["modes"] = [mode.value for mode in self.modes]
        answer.pop("fail_at")
        return answer

    def runs(self, section: str) -> bool:
        if section == "recovery":
            return section in self.sections and self.recovery_kills > 0
        return section in self.sections


# --quick: every section, small enough for a minute on a laptop.
QUICK = BenchOptions(
    sizes=(100, 1_000),
    enqueue_bulk=1_000,
    enqueue_single=200,
    latency_seconds=2.0,
    items=1_000,
    recovery_kills=1,
)


def bench_options(*, quick: bool, **given: Any) -> BenchOptions:
    """The defaults (or ``--quick``'s small figures), with the options given on top."""
    return replace(QUICK if quick else BenchOptions(), **given)


def parse_list(option: str, text: str, item: Callable[[str], T], hint: str) -> tuple[T, ...]:
    values = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        try:
            values.append(item(part))
        except ValueError:
            raise ConfigurationError(f"{option}: {part!r} is not {hint}") from None
    return tuple(values)


def parse_sizes(text: str) -> tuple[int, ...]:
    def size(part: str) -> int:
        value = int(part)
        if not 1 <= value <= MAX_SIZE:
            raise ValueError(part)
        return value

    return tuple(sorted(set(parse_list("--sizes", text, size, f"a job count (1 to {MAX_SIZE:,})"))))


def parse_modes(text: str) -> tuple[CommitMode, ...]:
    hint = "a commit mode (" + ", ".join(mode.value for mode in CommitMode) + ")"
    return _unique(parse_list("--modes", text, CommitMode, hint))


def parse_sections(text: str) -> tuple[str, ...]:
    def section(part: str) -> str:
        if part not in SECTIONS:
            raise ValueError(part)
        return part

    chosen = set(parse_list("--only", text, section, "a section (" + ", ".join(SECTIONS) + ")"))
    return tuple(s for s in SECTIONS if s in chosen)


def _unique(values: Sequence[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(values))
