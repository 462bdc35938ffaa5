"""Profiles: the validated run configuration a team keeps next to its training code.

    from zlayout.profile import build_profile, save_profile_dir, load_profile, attach_verification

    profile = build_profile(plan_input, layout)          # unverified, predicted figures
    save_profile_dir(profile, "profiles/llama3-8b")      # the whole set as one, with its manifest
    profile = load_profile("profiles/llama3-8b")         # ProfileError names line and field
    profile = attach_verification(profile, result)       # measured figures, new alerts, changelog
    save_profile(profile, "profiles/llama3-8b")          # the set again (a NAME.toml: that file alone)

    zlayout.profile.export.export_profile(...)           # export's rules: what may be replaced
    zlayout.profile.integrity.open_checked(path)         # load + the set agrees + stale prediction
    profile.plan_input(), profile.layout                 # every input, restored
"""

from zlayout.profile.build import attach_verification, build_profile, predict
from zlayout.profile.schema import SCHEMA_VERSION, Profile, RunSettings
from zlayout.profile.store import (DS_CONFIG_FILE, PROFILE_FILE, ProfileError, dumps_profile,
                                   load_profile, loads_profile, resolve_profile_path, save_profile,
                                   save_profile_dir)

__all__ = [
    "DS_CONFIG_FILE", "PROFILE_FILE", "SCHEMA_VERSION", "Profile", "ProfileError", "RunSettings",
    "attach_verification", "build_profile", "dumps_profile", "load_profile", "loads_profile",
    "predict", "resolve_profile_path", "save_profile", "save_profile_dir",
]
