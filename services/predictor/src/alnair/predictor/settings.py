"""Settings of the predictor service (env prefix `ALNAIR_PREDICTOR_`).

Connection settings also answer to the plain `ALNAIR_` names so one ConfigMap serves every
service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from alnair.common.settings import DEFAULT_HTTP_PORTS, ServiceSettings


class PredictorSettings(ServiceSettings):
    """Everything the predictor reads from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="ALNAIR_PREDICTOR_", extra="ignore", populate_by_name=True
    )

    http_port: int = Field(
        default=DEFAULT_HTTP_PORTS["predictor"],
        ge=0,
        le=65535,
        description="HTTP API port (0: any)",
    )
    model_kind: Literal["ratio", "rf", "gb"] = Field(
        default="ratio",
        description=(
            "model that serves: ratio (stacked cross-GPU ratios, random forest for"
            " co-location; best held-out throughput MAPE), rf (random forest) or gb"
            " (gradient-boosted trees)"
        ),
    )
    interval_level: float = Field(
        default=0.9, gt=0.0, lt=1.0, description="nominal coverage of predicted intervals"
    )
    retrain_debounce_s: float = Field(
        default=5.0,
        ge=0.0,
        description="retrain once no job completed for this long after a completion",
    )
    retrain_max_wait_s: float = Field(
        default=60.0,
        gt=0.0,
        description="retrain at the latest this long after the first completion of a burst",
    )
    validation_tolerance: float = Field(
        default=0.25,
        ge=0.0,
        description="relative holdout-MAPE margin a candidate may lose to the serving model",
    )
    models_kept: int = Field(default=10, ge=1, description="model versions kept in Redis")
    model_key: SecretStr | None = Field(
        default=None,
        description=(
            "secret (16 bytes or more) that signs stored model blobs with HMAC-SHA256; a blob"
            " it did not sign is never unpickled. Unset: a random key per process (dev only:"
            " a restart retrains instead of loading the stored model)"
        ),
    )
    gavel_path: Path | None = Field(
        default=None,
        description="Gavel throughputs.json or packaged-format CSV; unset: the packaged copy",
    )
    durable: str = Field(
        default="predictor-retrain", description="JetStream durable consumer for job events"
    )
    predict_subject: str = Field(
        default="alnair.predict", description="NATS request-reply subject for predictions"
    )
    source: str = Field(default="alnair-predictor", description="CloudEvents source")
