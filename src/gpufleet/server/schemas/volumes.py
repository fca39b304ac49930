from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from gpufleet.server.schemas.common import Name, Request

MAX_VOLUME_GB = 10_000_000  # 10 PB
SizeGb = Annotated[int, Field(ge=1, le=MAX_VOLUME_GB, strict=True)]
# An absolute path of plain segments: it ends up in mount units and fstab lines.
MountPath = Annotated[str, StringConstraints(max_length=255, pattern=r"^(/[A-Za-z0-9._-]+)+$")]


def _no_dot_segments(value: str | None) -> str | None:
    if value is not None and any(part in (".", "..") for part in value.split("/")):
        raise ValueError("mount_path must not contain . or .. segments")
    if value is not None and value.split("/")[1] in ("proc", "sys", "dev", "etc", "boot"):
        raise ValueError("mount_path must not be under /proc, /sys, /dev, /etc or /boot")
    return value


class CreateVolumeRequest(Request):
    name: Name
    size_gb: SizeGb
    mount_path: MountPath

    _mount_path = field_validator("mount_path")(_no_dot_segments)


class UpdateVolumeRequest(Request):
    size_gb: SizeGb | None = None
    mount_path: MountPath | None = None

    _mount_path = field_validator("mount_path")(_no_dot_segments)


class AttachVolumeRequest(Request):
    cluster: Annotated[str, StringConstraints(min_length=1, max_length=36)]
