"""The suite's hypothesis profiles and the one a run of the suite loads. Imported (by the installed plug-in, in any
pytest run of the environment) they are registered where no profile of the name exists: a plug-in must not replace
the profiles of the project it runs in, nor hypothesis' own `ci` (loaded where a CI variable is set). A run of the
suite registers them over any other (`activate`), hypothesis' `ci` included, whose 100 examples a property are not
the suite's ci.

ci: small and reproducible (derandomized) for two CPU cores, where seven implementations (three on the Triton
interpreter) run every property; dev: the default at a desk; thorough: hundreds of examples per property, for a
release or a new implementation; smoke: two (and the explicit examples), for a run that checks a pipeline, not the
implementations; gpu-short: the compiled check of `gpu_check --short`, which must compile few kernels: no draws,
and of each property's explicit examples the first of each input dtype alone (`conformance.harness.fitted` drops
the rest).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import InvalidArgument

CI = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILES = {
    "ci": CI,
    "dev": settings(max_examples=60, deadline=None, print_blob=True),
    "smoke": settings(CI, max_examples=2),
    "gpu-short": settings(CI, phases=[Phase.explicit], database=None),
    "thorough": settings(
        max_examples=500, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
    ),
}


def _registered(name: str) -> bool:
    try:
        settings.get_profile(name)
    except InvalidArgument:
        return False
    return True


def register(force: bool = False) -> None:
    """Register each profile whose name is free (every one with force)."""
    for name, profile in PROFILES.items():
        if force or not _registered(name):
            settings.register_profile(name, profile)


def default() -> str:
    """The profile a run takes unless --hypothesis-profile names one: PNMIX_HYPOTHESIS_PROFILE, else ci under CI
    (env CI set) and dev elsewhere."""
    return os.environ.get("PNMIX_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")


def activate(config=None) -> None:
    """For a run of the suite: register the suite's profiles over any other and load the run's (--hypothesis-profile,
    hypothesis' own option, which hypothesis may have loaded before they were registered), else `default()`."""
    register(force=True)
    chosen = config.getoption("hypothesis_profile", None) if config is not None else None
    settings.load_profile(chosen or default())


register()

__all__ = ["PROFILES", "activate", "default", "register"]
