"""Settings every service shares, read from the environment with the `ALNAIR_` prefix.

Each service subclasses `ServiceSettings` with its own prefix (`ALNAIR_SCHEDULER_` and so on)
while the connection settings below stay under plain `ALNAIR_` so one ConfigMap serves all.
Units are in the field names (`timeout_s`, `port`), and every field says what it is for.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from alnair.common.errors import ConfigError
from alnair.common.natsauth import NatsCredentials


class CommonSettings(BaseSettings):
    """Connections and identity shared by all services (env prefix `ALNAIR_`)."""

    # Connection fields keep their plain `ALNAIR_` names even in a service's settings class
    # (whose own prefix is `ALNAIR_<SERVICE>_`): one ConfigMap configures every service.
    model_config = SettingsConfigDict(env_prefix="ALNAIR_", extra="ignore", populate_by_name=True)

    nats_url: str = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_URL"),
        default="nats://127.0.0.1:4222",
        description="NATS server URL(s), comma-separated",
    )
    nats_user: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_USER"),
        default=None,
        description="NATS user of this service (its subject permissions: alnair.common.natsauth)",
    )
    nats_password: SecretStr | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_PASSWORD"),
        default=None,
        description="password of ALNAIR_NATS_USER (from a Secret)",
    )
    nats_creds_file: Path | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_CREDS"),
        default=None,
        description="NATS .creds file (JWT + nkey seed) instead of user and password",
    )
    nats_token_file: Path | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_TOKEN_FILE"),
        default=None,
        description=(
            "a node component's ServiceAccount token (projected, audience alnair-bus), read at "
            "each connect: the bus's auth callout admits it as its node only (busauth)"
        ),
    )
    nats_tls_ca_file: Path | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_TLS_CA"),
        default=None,
        description="CA certificate of the NATS server; set: connect with TLS and verify it",
    )
    nats_replicas: int = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_REPLICAS"),
        default=1,
        ge=1,
        le=5,
        description=(
            "servers of a JetStream cluster that keep each stream and KV bucket (3 in the "
            "production overlay's three-node cluster: one node's loss loses nothing)"
        ),
    )
    nats_tls_hostname: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_NATS_TLS_HOSTNAME"),
        default=None,
        description=(
            "the name NATS servers' certificates are checked against, whatever address is "
            "dialled (a cluster advertises its servers by IP)"
        ),
    )
    redis_url: str = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_URL"),
        default="redis://127.0.0.1:6379/0",
        description="Redis URL",
    )
    redis_user: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_USER"),
        default=None,
        description="Redis ACL user of this service (its rules: alnair.common.redisauth)",
    )
    redis_password: SecretStr | None = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_PASSWORD"),
        default=None,
        description="password of ALNAIR_REDIS_USER (from a Secret)",
    )
    redis_sentinels: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_SENTINELS"),
        default=None,
        description=(
            "Redis Sentinels as host:port[,host:port...]; set: connect to the primary they name "
            "(following a failover), with ALNAIR_REDIS_URL giving only the database number"
        ),
    )
    redis_sentinel_master: str = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_SENTINEL_MASTER"),
        default="alnair",
        description="the name the Sentinels monitor the Redis primary under",
    )
    redis_sentinel_password: SecretStr | None = Field(
        validation_alias=AliasChoices("ALNAIR_REDIS_SENTINEL_PASSWORD"),
        default=None,
        description="the Sentinels' password (their requirepass, from a Secret)",
    )
    kubeconfig: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_KUBECONFIG"),
        default=None,
        description="kubeconfig path; unset means in-cluster service account, then ~/.kube/config",
    )
    cluster: str = Field(
        validation_alias=AliasChoices("ALNAIR_CLUSTER"),
        default="default",
        description="name of this cluster in job events",
    )
    log_level: str = Field(
        validation_alias=AliasChoices("ALNAIR_LOG_LEVEL"),
        default="info",
        description="debug, info, warning or error",
    )
    log_json: bool = Field(
        validation_alias=AliasChoices("ALNAIR_LOG_JSON"),
        default=True,
        description="JSON log lines (false: human-readable)",
    )

    def nats_credentials(self) -> NatsCredentials:
        """What this service presents to NATS."""
        return NatsCredentials(
            user=self.nats_user,
            password=None if self.nats_password is None else self.nats_password.get_secret_value(),
            creds_file=self.nats_creds_file,
            tls_ca_file=self.nats_tls_ca_file,
            tls_hostname=self.nats_tls_hostname,
            token_file=self.nats_token_file,
        )

    def redis_credentials(self) -> dict[str, str]:
        """Keyword arguments for `redis.asyncio.from_url` (empty: the URL's own, if any)."""
        if self.redis_user is None:
            return {}
        if self.redis_password is None:
            raise ConfigError("ALNAIR_REDIS_USER is set without ALNAIR_REDIS_PASSWORD")
        return {"username": self.redis_user, "password": self.redis_password.get_secret_value()}


DEFAULT_HTTP_PORTS: dict[str, int] = {
    "scheduler": 8081,
    "predictor": 8082,
    "profiler-agent": 8083,
    "aggregator": 8084,
    "deviceplugin": 8085,
    "dispatcher": 8086,
    "elastic": 8087,
    "bus-auth": 8088,
    "scheduler-standby": 8089,
}
"""Each service's HTTP port unless configured: distinct, so every service runs side by side on
one machine (`make up`). The services' settings and the local stack read this one table."""


class ServiceSettings(CommonSettings):
    """Base for one service's settings: adds its HTTP listener (each service sets its port)."""

    http_host: str = Field(default="0.0.0.0", description="address the HTTP API listens on")
    http_port: int = Field(default=8080, ge=0, le=65535, description="HTTP API port (0: any)")
    http_cert_dir: str | None = Field(
        validation_alias=AliasChoices("ALNAIR_HTTP_CERT_DIR", "http_cert_dir"),
        default=None,
        description="folder of the API's serving certificate (tls.crt, tls.key: a mounted "
        "Secret, reloaded when it changes): the port then serves HTTPS only, as in the deploy; "
        "unset: plain HTTP, for local development",
    )
    http_auth: bool = Field(
        validation_alias=AliasChoices("ALNAIR_HTTP_AUTH", "http_auth"),
        default=True,
        description=(
            "mutating HTTP requests need a bearer token the API server authenticates"
            " (TokenReview); false only for local development"
        ),
    )
    http_auth_reads: bool = Field(
        validation_alias=AliasChoices("ALNAIR_HTTP_AUTH_READS", "http_auth_reads"),
        default=False,
        description=(
            "reads of one namespace's data (a job's explanation, a pod's profile) need a token "
            "whose identity may get that object (SubjectAccessReview); on in the deploy, off "
            "for the local stack and tests that read without a token"
        ),
    )
    http_auth_audiences: list[str] = Field(
        validation_alias=AliasChoices("ALNAIR_HTTP_AUTH_AUDIENCES", "http_auth_audiences"),
        default=["alnair"],
        description=(
            "audiences a caller's token must carry (TokenReview spec.audiences): a token minted "
            "for Alnair (`kubectl create token SA --audience alnair`) is not one the API "
            "server accepts, so a service that sees it cannot replay it there; empty: the API "
            "server's own audiences"
        ),
    )
    http_auth_cache_s: float = Field(
        validation_alias=AliasChoices("ALNAIR_HTTP_AUTH_CACHE_S", "http_auth_cache_s"),
        default=10.0,
        ge=0.0,
        description="how long a token's review is reused before the API server is asked again",
    )


class LeaderElectionSettings(BaseSettings):
    """One replica of a deciding service acts at a time, elected through a Lease
    (`alnair.common.leader`); each service names its Lease (`lease_name`)."""

    leader_elect: bool = Field(
        default=True, description="elect one active replica through a Lease (false: act alone)"
    )
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="this replica's name in the leader Lease (the pod name in the deploy)",
    )
    lease_namespace: str = Field(default="kube-system", description="leader Lease namespace")
    lease_duration_s: float = Field(
        default=15.0, gt=0, description="how long a follower waits, after it last saw the Lease "
        "change, before it takes over",
    )  # fmt: skip
    renew_deadline_s: float = Field(
        default=10.0,
        gt=0,
        description="stop acting when no renewal of the Lease has succeeded for this long "
        "(less than the lease duration, so a follower never takes over while this one acts)",
    )
    retry_period_s: float = Field(
        default=2.0, gt=0, description="how often the leader renews, and followers try"
    )
