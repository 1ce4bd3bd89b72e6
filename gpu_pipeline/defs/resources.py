"""Resources: where the data root and the sources are. Values come from the environment
(``dg.EnvVar``), resolved when a run starts, never at import. See README "Configuration"."""

from pathlib import Path

import dagster as dg

from gpu_pipeline.lib.store import Store


class DataStoreResource(dg.ConfigurableResource):
    """The Parquet/plot data root (``GPU_PIPELINE_DATA_ROOT``)."""

    data_root: str

    def store(self) -> Store:
        return Store(self.data_root)


class CondorArchiveResource(dg.ConfigurableResource):
    """Monthly HTCondor slot-state archives (``gpu_state_YYYY-MM.db`` / ``.parquet``)."""

    archive_dir: str
    source_timezone: str = "UTC"
    excluded_hosts: str = ""

    @property
    def path(self) -> Path:
        return Path(self.archive_dir).expanduser()

    def excluded_patterns(self) -> list[str]:
        return [p.strip() for p in self.excluded_hosts.split(",") if p.strip()]


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        resources={
            "data_store": DataStoreResource(data_root=dg.EnvVar("GPU_PIPELINE_DATA_ROOT")),
            "condor_archive": CondorArchiveResource(
                archive_dir=dg.EnvVar("GPU_PIPELINE_CONDOR_ARCHIVE"),
                source_timezone=dg.EnvVar("GPU_PIPELINE_SOURCE_TZ"),
                excluded_hosts=dg.EnvVar("GPU_PIPELINE_EXCLUDED_HOSTS"),
            ),
        }
    )
