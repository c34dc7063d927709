"""Settings of the ElasticJob controller (env prefix `ALNAIR_ELASTIC_`).

Connection settings also answer to the plain `ALNAIR_` names so one ConfigMap serves every
service.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from alnair.common.settings import DEFAULT_HTTP_PORTS, LeaderElectionSettings, ServiceSettings


class ElasticSettings(ServiceSettings, LeaderElectionSettings):
    """Everything the controller reads from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="ALNAIR_ELASTIC_", extra="ignore", populate_by_name=True
    )

    lease_name: str = Field(default="alnair-elastic", description="leader Lease name")

    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["elastic"], ge=0, le=65535, description="HTTP API port (0: any)"
    )
    namespace: str = Field(
        default="", description="namespace whose ElasticJobs this controller runs (empty: all)"
    )
    nats_enabled: bool = Field(
        default=True,
        description="consume scale requests and publish applied/refused scale events over NATS",
    )
    durable: str = Field(
        default="elastic-scale", description="JetStream durable consumer for scale requests"
    )
    source: str = Field(default="alnair-elastic", description="CloudEvents source")
    hosts_url: str = Field(
        default="",
        description=(
            "base URL workers reach this controller at (e.g. http://alnair-elastic.alnair:8087);"
            " set: Horovod's discovery script asks it for the hosts before reading its file"
        ),
    )
    error_backoff_s: float = Field(
        default=1.0, gt=0, description="wait before reconciling a job again after an API error"
    )
    max_history: int = Field(
        default=50, ge=1, description="resizes kept per job for GET /v1/elasticjobs/<ns>/<name>"
    )
