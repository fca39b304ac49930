"""What Prometheus reads from gpufleet besides /metrics: its HTTP service discovery."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ScrapeTargetGroup(BaseModel):
    """One entry of Prometheus's HTTP SD list (``http_sd_config``): the targets to scrape
    and the labels every series scraped from them carries."""

    model_config = ConfigDict(frozen=True)

    targets: list[str]
    labels: dict[str, str]
