"""What a GPU-hour costs: `$GPUPOOL_HOME/prices.yaml`, read by the server for `gpupool usage` (see
control/accounting.py and docs/operations.md).

    currency: USD
    gpu_hour:          # the price of one GPU-hour, by GPU model as `gpupool nodes` shows it
      H100: 2.49
      A100: 1.29
      default: 1.00    # any other model (leave it out to leave other models unpriced)

A fraction of a GPU costs that fraction. Model names match without regard to case.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.spec.document import validate_spec
from gpupool.spec.errors import SpecError

DEFAULT_MODEL: Final = "default"
PRICES_FIELD_EXAMPLES: Final[dict[str, str]] = {
    "": "{currency: USD, gpu_hour: {H100: 2.49, A100: 1.29, default: 1.0}}",
    "currency": "USD",
    "gpu_hour": "{H100: 2.49, default: 1.0}",
}
"""A valid example for each field path, shown in every error about that field."""

Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class PricesSpec(BaseModel):
    """Prices of GPU-hours by GPU model, in one currency."""

    model_config = ConfigDict(extra="forbid")

    currency: str = Field(
        default="USD",
        min_length=1,
        max_length=8,
        pattern=r"^[A-Za-z]+$",
        description="What the prices are in, as the reports print it (USD, EUR, credits...); default USD.",
    )
    gpu_hour: dict[str, Price] = Field(
        min_length=1,
        description="The price of one GPU-hour by GPU model (H100, A100, ...); `default` prices any "
        "model not listed.",
    )

    @field_validator("gpu_hour", mode="before")
    @classmethod
    def _one_name_per_model(cls, value: object) -> object:
        """Each model priced once (names match without regard to case), by a number."""
        if not isinstance(value, dict):
            return value  # pydantic says it is not a mapping
        seen: dict[str, str] = {}
        for name in value:
            if not isinstance(name, str) or not name.strip():
                raise SpecError(
                    "gpu_hour", name, "has a model name that is not text; name the model", "{H100: 2.49}"
                )
            key = name.strip().lower()
            if key in seen:
                raise SpecError(
                    f"gpu_hour.{name}",
                    value[name],
                    f"prices the same model as gpu_hour.{seen[key]} (names match without regard to case); "
                    "keep one",
                    "{H100: 2.49}",
                )
            if isinstance(value[name], bool):  # pydantic's lax mode would read true as 1
                raise SpecError(f"gpu_hour.{name}", value[name], "is true/false, not a price", "2.49")
            seen[key] = name
        return value

    def of(self, model: str) -> float | None:
        """The price of a GPU-hour of `model`, or None when neither it nor `default` is priced."""
        table = {name.strip().lower(): price for name, price in self.gpu_hour.items()}
        price = table.get(model.strip().lower())
        return price if price is not None else table.get(DEFAULT_MODEL)


def parse_prices_spec(data: object) -> PricesSpec:
    """A PricesSpec from a mapping or YAML text; SpecError (the first problem, with its field) if invalid."""
    return validate_spec(PricesSpec, data, PRICES_FIELD_EXAMPLES, "price list")
