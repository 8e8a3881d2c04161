"""Prices the user writes (the spec states none, so imagebatch ships none, only an example file), and the
budgets a run can be given: `--max-images N` and `--max-spend AMOUNT` (which needs prices).

Only images are priced: they are what a catalog run pays for, and what can be bounded before sending
(images at most x price); the relay routes' token counts are in the usage summary, unpriced. A model or
size the table does not name costs nothing in the estimate and is listed as unpriced, so a missing line
is seen rather than silently free. The table's format is on `PriceTable`.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagebatch.gateway.constants import ENV_PRICES
from imagebatch.manifest import PlannedRequest
from imagebatch.work.store import RequestRecord


class PriceError(ValueError):
    """A price file that cannot be read; the message names the file and the entry."""


@dataclass(frozen=True)
class PriceTable:
    """A price table, from TOML or JSON:

    currency = "USD"
    [images]                      # per image delivered, by model; a number, or a table by size
    "native-image-2.1" = 0.04
    "native-image-pro" = { "1K" = 0.13, "2K" = 0.13, "4K" = 0.24 }
    "compat-image-2" = { "1024x1024" = 0.04, "default" = 0.06 }
    """

    images: dict[str, float | dict[str, float]] = field(default_factory=dict)
    currency: str = ""

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        path = Path(path)
        try:
            raw = path.read_bytes()
            data: Any = tomllib.loads(raw.decode()) if path.suffix != ".json" else json.loads(raw)
        except (OSError, ValueError) as exc:
            raise PriceError(f"{path}: cannot read the price table: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("images", {}), dict):
            raise PriceError(f"{path}: expected an [images] table of prices by model")
        table = cls(images=dict(data.get("images", {})), currency=str(data.get("currency", "")))
        for model, price in table.images.items():
            values = price.values() if isinstance(price, dict) else [price]
            if not all(isinstance(v, int | float) and v >= 0 for v in values):
                raise PriceError(
                    f"{path}: images.{model}: a price is a number of 0 or more (or a table by size)"
                )
        return table

    @classmethod
    def from_option(cls, path: str | None) -> PriceTable | None:
        """The table named by `--prices`, else by `ENV_PRICES` (`IMAGEBATCH_PRICES`), else None."""
        chosen = path or os.environ.get(ENV_PRICES)
        return cls.load(chosen) if chosen else None

    def image_price(self, model: str, size: str) -> float | None:
        price = self.images.get(model)
        if isinstance(price, dict):
            found = price.get(size, price.get("default"))
            return None if found is None else float(found)
        return None if price is None else float(price)

    def price_of(self, req: PlannedRequest) -> float | None:
        """The price of one image of `req` (its model at its size), or None if the table has none."""
        size = req.size if req.route.value.startswith("images") else req.image_size
        return self.image_price(req.model, size)

    def most(self, req: PlannedRequest) -> float:
        """The most one planned request can cost: its images at most, at its model's and size's price."""
        return req.images_at_most * (self.price_of(req) or 0.0) if req.images_at_most else 0.0

    def spent(self, req: PlannedRequest, record: RequestRecord) -> float:
        """What a settled request cost, by the images it delivered (this run)."""
        if record.status != "succeeded" or not record.images:
            return 0.0
        return record.images * (self.price_of(req) or 0.0)

    def unpriced(self, requests: Iterable[PlannedRequest]) -> list[str]:
        """Models the plan asks images of that the table does not price."""
        return sorted({r.model for r in requests if r.images_at_most and self.price_of(r) is None})

    def money(self, amount: float) -> str:
        return money(amount, self.currency)


def money(amount: float, currency: str = "") -> str:
    """An amount as every message and table shows it: `1,234.50 USD` (no currency: `1,234.50`)."""
    return f"{amount:,.2f} {currency}".strip()


def estimate(requests: Iterable[PlannedRequest], prices: PriceTable) -> dict[str, float]:
    """The most a plan can cost, by model (images at most x price)."""
    return Estimate(prices).add_all(requests).by_model()


def estimate_lines(requests: Iterable[PlannedRequest], prices: PriceTable) -> list[str]:
    """`estimate` as `imagebatch validate --prices` prints it: a line per model, the total, and the models
    the table does not price. `requests` is gone over once (the plan as a stream)."""
    return Estimate(prices).add_all(requests).lines()


class Estimate:
    """The most a plan can cost, added up a request at a time (`add`), so that a caller going over the plan
    for something else counts it on the way: what it keeps is a sum per model and the models the table
    does not price, never the requests."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self._by: dict[str, float] = {}
        self._unpriced: set[str] = set()

    def add(self, req: PlannedRequest) -> None:
        self._by[req.model] = self._by.get(req.model, 0.0) + self.prices.most(req)
        if req.images_at_most and self.prices.price_of(req) is None:
            self._unpriced.add(req.model)  # as `PriceTable.unpriced` finds them

    def add_all(self, requests: Iterable[PlannedRequest]) -> Estimate:
        for req in requests:
            self.add(req)
        return self

    def by_model(self) -> dict[str, float]:
        return dict(sorted(self._by.items()))

    def lines(self) -> list[str]:
        """A line per model, the total, and the models the table does not price."""
        by_model = self.by_model()
        lines = [f"  {model:<24} {self.prices.money(amount)}" for model, amount in by_model.items()]
        lines.append(f"  {'total':<24} {self.prices.money(sum(by_model.values()))}")
        if self._unpriced:
            lines.append(f"  no price for {', '.join(sorted(self._unpriced))}: counted as 0")
        return lines
