"""Resources: where the data root and the sources are.

Values come from the environment through ``dg.EnvVar`` and are resolved when a run starts, so
secrets never enter the definitions, the UI's config view or the event log. Required variables are
always bound; an optional variable is bound only when it is set (otherwise the field's default,
which disables that source). See README "Configuration".
"""

import math
import os
from pathlib import Path

import dagster as dg

from gpu_pipeline.lib.demand import kueue_gpu_resources
from gpu_pipeline.lib.envutil import DATA_ROOT_VAR, data_root, required_setting, setting_number, zone_env
from gpu_pipeline.lib.es_source import EsConfig
from gpu_pipeline.lib.prometheus_source import PrometheusConfig
from gpu_pipeline.lib.store import Store
from gpu_pipeline.lib.telemetry import query_fields_setting

#: the --query-gpu list of header-less nvidia-smi logs
NVIDIA_SMI_FIELDS_VAR = "GPU_PIPELINE_NVIDIA_SMI_FIELDS"


def optional_env(name: str, default: str = "") -> str:
    """``dg.EnvVar(name)`` when the variable is set, else ``default`` (the source stays off). A
    blank value (a ``.env`` line ``NAME=``) is unset: it gets the default, not an empty setting."""
    return dg.EnvVar(name) if (os.environ.get(name) or "").strip() else default


class DataStoreResource(dg.ConfigurableResource):
    """The Parquet/plot data root (``GPU_PIPELINE_DATA_ROOT``); empty, the default of
    :func:`~gpu_pipeline.lib.envutil.data_root` (``$DAGSTER_HOME/data``, else ``./data``) as the
    run's environment gives it."""

    data_root: str = ""

    def store(self) -> Store:
        return Store(self.data_root.strip() or data_root())


class CondorArchiveResource(dg.ConfigurableResource):
    """Monthly HTCondor slot-state archives (``gpu_state_YYYY-MM.db`` / ``.parquet``)."""

    archive_dir: str
    source_timezone: str = "UTC"
    excluded_hosts: str = ""

    @property
    def path(self) -> Path:
        folder = required_setting("GPU_PIPELINE_CONDOR_ARCHIVE", self.archive_dir,
                                  "the folder of the monthly gpu_state archives")
        return Path(folder).expanduser()

    def excluded_patterns(self) -> list[str]:
        return [p.strip() for p in self.excluded_hosts.split(",") if p.strip()]


#: The days a job-record file is read after the day it is named for (files mode); also how many days
#: the late-records schedule re-runs (``defs/jobs.py``)
LOOKAHEAD_ENV = "GPU_PIPELINE_JOBS_LOOKAHEAD_DAYS"
DEFAULT_LOOKAHEAD_DAYS = 7


class JobRecordsResource(dg.ConfigurableResource):
    """HTCondor job records: Elasticsearch (condor_adstash index) or offline files.

    ``es_hosts`` set: read the index with point-in-time paging. Else ``files_dir`` set: read the
    NDJSON (``*.ndjson``, adstash ``_source`` documents), Elasticsearch exports (``*.es.json``) and
    ``condor_history -json`` dumps (``*.json``) in it. Neither: the source is off (empty tables).
    """

    es_hosts: str = ""
    es_index: str = "adstash-ospool-job-history"
    es_api_key: str = ""
    es_username: str = ""
    es_password: str = ""
    es_ca_certs: str = ""
    es_verify_certs: str = "true"
    es_timeout_s: str = "30"
    files_dir: str = ""
    lookahead_days: str = str(DEFAULT_LOOKAHEAD_DAYS)

    @property
    def mode(self) -> str:
        if self.es_hosts.strip():
            return "elasticsearch"
        if self.files_dir.strip():
            return "files"
        return "off"

    def lookahead_days_value(self) -> int:
        return int(setting_number(LOOKAHEAD_ENV, self.lookahead_days, whole=True))

    def es_config(self) -> EsConfig:
        return EsConfig(
            hosts=self.es_hosts,
            index=self.es_index,
            api_key=self.es_api_key or None,
            username=self.es_username or None,
            password=self.es_password or None,
            verify_certs=self.es_verify_certs.strip().lower() not in {"0", "false", "no", "off"},
            ca_certs=self.es_ca_certs or None,
            request_timeout=setting_number("GPU_PIPELINE_ES_TIMEOUT_S", self.es_timeout_s, positive=True),
        )


MIN_COVERAGE_VAR = "GPU_PIPELINE_TELEMETRY_MIN_COVERAGE_PCT"
DEFAULT_TELEMETRY_MIN_COVERAGE_PCT = 80


class TelemetryResource(dg.ConfigurableResource):
    """GPU telemetry: files (``<dir>/nvidia-smi/HOST/*.csv``, ``<dir>/dcgm/HOST/*.prom``, either
    also gzip- or zstd-compressed as ``*.csv.gz`` / ``*.prom.zst`` ...,
    ``<dir>/nvml/HOST/*.parquet``; nvidia-smi timestamps are local time in ``source_timezone``)
    and/or DCGM history from a Prometheus server (``query_range`` at ``prometheus_step_s``)."""

    telemetry_dir: str = ""
    source_timezone: str = "UTC"
    file_margin_days: str = "0"
    prometheus_url: str = ""
    prometheus_token: str = ""
    prometheus_username: str = ""
    prometheus_password: str = ""
    prometheus_ca_file: str = ""
    prometheus_verify_tls: str = "true"
    prometheus_step_s: str = "30"
    prometheus_selector: str = ""

    terapixel_dir: str = ""
    nvidia_smi_fields: str = ""
    min_coverage_pct: str = str(DEFAULT_TELEMETRY_MIN_COVERAGE_PCT)

    @property
    def enabled(self) -> bool:
        return any(v.strip() for v in (self.telemetry_dir, self.prometheus_url, self.terapixel_dir))

    def nvidia_smi_fields_value(self) -> tuple[str, ...] | None:
        return query_fields_setting(self.nvidia_smi_fields, NVIDIA_SMI_FIELDS_VAR)

    @property
    def files_enabled(self) -> bool:
        return bool(self.telemetry_dir.strip())

    def min_coverage(self) -> float:
        """The blocking ``coverage`` check's threshold as a share (``GPU_PIPELINE_TELEMETRY_MIN_COVERAGE_PCT``,
        0-100; 0: coverage never fails the check)."""
        pct = setting_number(MIN_COVERAGE_VAR, self.min_coverage_pct)
        if not 0 <= pct <= 100:
            raise ValueError(f"{MIN_COVERAGE_VAR}={self.min_coverage_pct.strip()!r}: expected a percentage, 0 to 100")
        return pct / 100.0

    def file_margin_days_value(self) -> int:
        return int(setting_number("GPU_PIPELINE_TELEMETRY_MARGIN_DAYS", self.file_margin_days, whole=True))

    def prometheus_config(self) -> PrometheusConfig | None:
        if not self.prometheus_url.strip():
            return None
        return PrometheusConfig(
            base_url=self.prometheus_url,
            bearer_token=self.prometheus_token or None,
            username=self.prometheus_username or None,
            password=self.prometheus_password or None,
            ca_file=self.prometheus_ca_file or None,
            verify_tls=self.prometheus_verify_tls.strip().lower() not in {"0", "false", "no", "off"},
            step_s=setting_number("GPU_PIPELINE_PROMETHEUS_STEP_S", self.prometheus_step_s, positive=True),
            extra_selector=self.prometheus_selector,
        )

    @property
    def path(self) -> Path:
        return Path(self.telemetry_dir).expanduser()


class KueueResource(dg.ConfigurableResource):
    """A directory of Kueue controller ``/metrics`` scrape files (Kubernetes demand); off when empty.

    ``gpus_per_workload``: GPUs a pending workload asks for, where every workload of the cluster asks
    for the same number; the demand of a scrape without the pending-resources series is then its
    pending workloads x this (empty: such a scrape's demand is unknown unless nothing is pending).
    ``gpu_resources``: the Kubernetes resource names counted as GPUs, comma-separated, ``*`` a
    glob (empty: ``nvidia.com/gpu``)."""

    scrape_dir: str = ""
    cluster: str = ""
    gpus_per_workload: str = ""
    gpu_resources: str = ""

    def gpu_resources_value(self) -> tuple[str, ...]:
        return kueue_gpu_resources(self.gpu_resources, GPU_RESOURCES_VAR)

    @property
    def enabled(self) -> bool:
        return bool(self.scrape_dir.strip())

    def gpus_per_workload_value(self) -> float | None:
        text = self.gpus_per_workload.strip()
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD={text!r}: not a positive number of GPUs")
        return value


GPU_RESOURCES_VAR = "GPU_PIPELINE_KUEUE_GPU_RESOURCES"


@dg.definitions
def resources() -> dg.Definitions:
    # a time zone that is no zone is said when the definitions load, naming its variable (at run
    # time every day failed with the bare key)
    for name in ("GPU_PIPELINE_SOURCE_TZ", "GPU_PIPELINE_TELEMETRY_TZ"):
        zone_env(name)
    kueue_gpu_resources(os.environ.get(GPU_RESOURCES_VAR), GPU_RESOURCES_VAR)  # a bad name, said at load
    query_fields_setting(os.environ.get(NVIDIA_SMI_FIELDS_VAR) or "", NVIDIA_SMI_FIELDS_VAR)  # likewise
    source_tz = optional_env("GPU_PIPELINE_SOURCE_TZ", "UTC")
    return dg.Definitions(
        resources={
            "data_store": DataStoreResource(data_root=optional_env(DATA_ROOT_VAR)),
            "condor_archive": CondorArchiveResource(
                archive_dir=dg.EnvVar("GPU_PIPELINE_CONDOR_ARCHIVE"),
                source_timezone=source_tz,
                excluded_hosts=optional_env("GPU_PIPELINE_EXCLUDED_HOSTS"),
            ),
            "job_records": JobRecordsResource(
                es_hosts=optional_env("GPU_PIPELINE_ES_HOSTS"),
                es_index=optional_env("GPU_PIPELINE_ES_INDEX", "adstash-ospool-job-history"),
                es_api_key=optional_env("GPU_PIPELINE_ES_API_KEY"),
                es_username=optional_env("GPU_PIPELINE_ES_USERNAME"),
                es_password=optional_env("GPU_PIPELINE_ES_PASSWORD"),
                es_ca_certs=optional_env("GPU_PIPELINE_ES_CA_CERTS"),
                es_verify_certs=optional_env("GPU_PIPELINE_ES_VERIFY_CERTS", "true"),
                es_timeout_s=optional_env("GPU_PIPELINE_ES_TIMEOUT_S", "30"),
                files_dir=optional_env("GPU_PIPELINE_JOBS_DIR"),
                lookahead_days=optional_env(LOOKAHEAD_ENV, str(DEFAULT_LOOKAHEAD_DAYS)),
            ),
            "kueue": KueueResource(
                scrape_dir=optional_env("GPU_PIPELINE_KUEUE_DIR"),
                cluster=optional_env("GPU_PIPELINE_KUEUE_CLUSTER"),
                gpus_per_workload=optional_env("GPU_PIPELINE_KUEUE_GPUS_PER_WORKLOAD"),
                gpu_resources=optional_env(GPU_RESOURCES_VAR),
            ),
            "telemetry": TelemetryResource(
                telemetry_dir=optional_env("GPU_PIPELINE_TELEMETRY_DIR"),
                source_timezone=optional_env("GPU_PIPELINE_TELEMETRY_TZ", "") or source_tz,
                file_margin_days=optional_env("GPU_PIPELINE_TELEMETRY_MARGIN_DAYS", "0"),
                prometheus_url=optional_env("GPU_PIPELINE_PROMETHEUS_URL"),
                prometheus_token=optional_env("GPU_PIPELINE_PROMETHEUS_TOKEN"),
                prometheus_username=optional_env("GPU_PIPELINE_PROMETHEUS_USERNAME"),
                prometheus_password=optional_env("GPU_PIPELINE_PROMETHEUS_PASSWORD"),
                prometheus_ca_file=optional_env("GPU_PIPELINE_PROMETHEUS_CA_FILE"),
                prometheus_verify_tls=optional_env("GPU_PIPELINE_PROMETHEUS_VERIFY_TLS", "true"),
                prometheus_step_s=optional_env("GPU_PIPELINE_PROMETHEUS_STEP_S", "30"),
                prometheus_selector=optional_env("GPU_PIPELINE_PROMETHEUS_SELECTOR"),
                terapixel_dir=optional_env("GPU_PIPELINE_TERAPIXEL_DIR"),
                nvidia_smi_fields=optional_env(NVIDIA_SMI_FIELDS_VAR),
                min_coverage_pct=optional_env(MIN_COVERAGE_VAR, str(DEFAULT_TELEMETRY_MIN_COVERAGE_PCT)),
            ),
        }
    )
