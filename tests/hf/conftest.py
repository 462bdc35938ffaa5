"""config.json fixtures: small hand-written ones with each model type's real keys (configs/small)
and the published full-size configs of public models (configs/published)."""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
SMALL_CONFIGS = sorted((CONFIGS / "small").glob("*.json"))
PUBLISHED_CONFIGS = sorted((CONFIGS / "published").glob("*.json"))
