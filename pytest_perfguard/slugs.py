"""Device model names as file names and ids: the slug a baseline file, a results file and a merge key a device
by (measure/device.py reads the name, judge/storage.py names the file)."""

from __future__ import annotations

import re

SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def device_slug(name: str) -> str:
    """File-name-safe slug of a device model name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:100].strip("-")
    return slug or "unknown-device"
