"""What an export did, as the command prints it and the flow logs it: the counts, then by name what a
person must know before shipping DEST: the deliverables missing and why, the files of an earlier export
set aside (or removed), and the images below the delivery size."""

from __future__ import annotations

from dataclasses import dataclass, field

from imagebatch.delivery.exportplan import Deliverable, Missing
from imagebatch.delivery.listing import EXPORT_CSV

SHOWN = 20
"""Names listed one by one in each part of the summary; export.csv lists every one."""


def _named(items: list[str]) -> str:
    more = f", and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "".join(f"\n  {item}" for item in items[:SHOWN]) + more


def _files(items: list[str]) -> str:
    return f"{len(items)} file{'s' if len(items) != 1 else ''}"


@dataclass
class ExportSummary:
    dest: str
    delivered: int = 0
    written: int = 0
    unchanged: int = 0
    overwritten: int = 0
    """Files of someone else's replaced (`--overwrite`)."""
    replaced: int = 0
    """Files an earlier export wrote (export.csv says so), replaced by a newer image."""
    export_csv_written: bool = False
    deliverables: list[Deliverable] = field(default_factory=list, repr=False)
    missing: list[Missing] = field(default_factory=list, repr=False)
    set_aside: list[str] = field(default_factory=list)
    """Files an earlier export delivered that this one does not: moved to `aside_to`, or removed with
    `--prune`."""
    changed_aside: list[str] = field(default_factory=list)
    """Such files changed since export wrote them: moved to `aside_to`, even with `--prune`."""
    kept: list[str] = field(default_factory=list)
    """Files `--overwrite` replaced, each kept in `aside_to` first."""
    aside_to: str | None = None
    """The folder under DEST files were moved to or kept in; None if none was."""
    pruned: bool = False
    delivery_size: str | None = None
    """`--canvas WxH` or `--max-side N`, as said in the warning."""
    approved_only: bool = False

    def counts(self) -> dict[str, int]:
        return {
            "delivered": self.delivered,
            "written": self.written,
            "unchanged": self.unchanged,
            "replaced": self.replaced,
            "overwritten": self.overwritten,
            "missing": len(self.missing),
            "set_aside": len(self.set_aside) + len(self.changed_aside),
        }

    def line(self) -> str:
        """The first line: the counts."""
        if not self.delivered:
            why = (
                "no image is approved (`imagebatch review OUT`)"
                if self.approved_only
                else "no image succeeded"
            )
            listed = f"{EXPORT_CSV} lists what is missing" if self.missing else "nothing written"
            return f"nothing exported to {self.dest}: {why}; {listed}"
        replaced = f", {self.replaced} replaced (newer than the earlier export's)" if self.replaced else ""
        overwritten = f", {self.overwritten} replaced (--overwrite)" if self.overwritten else ""
        return (
            f"exported {self.delivered} image{'s' if self.delivered != 1 else ''} to {self.dest}: "
            f"{self.written} written, {self.unchanged} unchanged{replaced}{overwritten}; listed in "
            f"{EXPORT_CSV}"
        )

    def lines(self) -> list[str]:
        """The counts, then each missing deliverable and each file set aside, by name."""
        out = [self.line()]
        if self.missing:
            out.append(
                f"{len(self.missing)} missing (not in {self.dest}; {EXPORT_CSV} lists each):"
                + _named(
                    [f"{m.label}: {m.reason}" + (f" ({m.name})" if m.name else "") for m in self.missing]
                )
            )
        if self.set_aside:
            where = "removed (--prune)" if self.pruned else f"moved to {self.aside_to}"
            out.append(f"{_files(self.set_aside)} of an earlier export not delivered now, {where}:")
            out[-1] += _named(self.set_aside)
        if self.changed_aside:
            out.append(
                f"{_files(self.changed_aside)} of an earlier export not delivered now, changed since it "
                f"wrote them, moved to {self.aside_to} (never removed):" + _named(self.changed_aside)
            )
        if self.kept:
            out.append(
                f"{_files(self.kept)} replaced (--overwrite), the earlier one kept in {self.aside_to}:"
                + _named(self.kept)
            )
        return out

    def warnings(self) -> list[str]:
        """The images smaller than the delivery size (padded or kept small, never enlarged)."""
        small = [d.name for d in self.deliverables if d.staged is not None and d.staged.small]
        if not small:
            return []
        are = f"{len(small)} images are" if len(small) != 1 else "1 image is"
        return [
            f"warning: {are} below the delivery size ({self.delivery_size}), not enlarged:" + _named(small)
        ]
