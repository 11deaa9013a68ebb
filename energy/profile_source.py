"""Where a planning policy's energy profile comes from: a saved `wattwise profile`, or the
perf model of a named model, GPU and measurement set. One set of fields, so that every
policy that plans on a profile is configured, and builds it, the same way."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from energy.calibration import default_perf_model
from energy.profile import EnergyProfile
from energy.profile_builder import build_profile


class EnergyProfileSource(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default="llama2-70b", description="Model the energy profile is built for.")
    hardware: str = Field(default="h100-80gb", description="GPU the energy profile is built for.")
    profile: str | None = Field(default=None, description=(
        "Named perf/power profile (energy.profiles) the energy profile is built from;"
        " None: the default for model and hardware."))
    profile_path: str | None = Field(default=None, description=(
        "An energy profile from `wattwise profile --out` to load; None: built from the perf model."))

    def energy_profile(self, kv_budget: float = 1.0) -> EnergyProfile:
        """The saved profile if one is named, else one built from the perf model, a load filling
        more than `kv_budget` of an instance's KV counted infeasible; an empty one is
        refused."""
        profile = (EnergyProfile.load(self.profile_path) if self.profile_path else
                   build_profile(default_perf_model(self.model, self.hardware, self.profile),
                                 kv_budget=kv_budget))
        if not profile.points:  # every planner on it would fail further in, and less clearly
            raise ValueError(f"the energy profile ({self.profile_name()}) has no shape that meets the SLOs: "
                             f"nothing to plan on for {self.model} on {self.hardware}")
        return profile

    def profile_name(self) -> str:
        """The profile in words, for errors."""
        return self.profile_path or self.profile or "the default"
