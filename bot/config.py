"""Strict, typed configuration, loaded once by the CLI and handed to ``app.build``.

Invariants:
- Unknown keys, wrong types and out-of-range values fail with one ``ConfigError`` whose message
  names the source (the file and key, or the environment variable that set it), every bad key
  path and the fix in plain words (no validation-library jargon). Nothing starts on a bad config.
- A loaded ``Config`` remembers where it came from (``source``, ``env_keys``) so later checks
  (``bot.ops.preflight``) can blame the file or the variable too.
- Secrets never come from YAML: only the *name* of an environment variable is configured
  (``api_key_env``, ``token_env``); the value is read from the environment when needed.
- Environment overrides (applied after the file): MESHSAGE_CONFIG (path), MESHSAGE_STATE_DIR,
  MESHSAGE_LLM_BASE_URL, MESHSAGE_LLM_MODEL.
- No file at all is valid: defaults run the console transport against Ollama on localhost.
"""

from __future__ import annotations

import contextlib
import difflib
import getpass
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from bot.errors import ConfigError
from bot.transports.mesh_text import MIN_PACKET_SPACING_SECONDS
from bot.yaml_unique import load_unique

ENV_CONFIG = "MESHSAGE_CONFIG"
ENV_STATE_DIR = "MESHSAGE_STATE_DIR"
ENV_LLM_BASE_URL = "MESHSAGE_LLM_BASE_URL"
ENV_LLM_MODEL = "MESHSAGE_LLM_MODEL"

DEFAULT_SYSTEM_PROMPT = (
    "You are meshsage, a helpful assistant reached over chat and LoRa mesh radio. "
    "Answer briefly and plainly. Use the notes about the person and earlier conversation "
    "when they are relevant; say so when you do not know."
)


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https:// (e.g. http://localhost:11434/v1)")
    return v.rstrip("/")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class Endpoint(_Strict):
    base_url: str = "http://localhost:11434/v1"
    model: str = "llama3.2:3b"
    api_key_env: str | None = "OPENAI_API_KEY"
    # False for chat templates without a system role (Gemma): the system text then opens the
    # first user message (the turns already alternate strictly, user first and last).
    system_role: bool = True

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a model the server has (e.g. llama3.2:3b)")
        return v


class LLMConfig(Endpoint):
    fallbacks: tuple[Endpoint, ...] = ()
    connect_timeout: float = Field(5.0, gt=0, le=120)
    read_timeout: float = Field(120.0, gt=0, le=3600)
    retries: int = Field(1, ge=0, le=10)
    retry_backoff: float = Field(2.0, ge=0, le=300)
    concurrency: int = Field(1, ge=1, le=64)
    temperature: float = Field(0.7, ge=0, le=2)
    strip_thinking: bool = True
    vision: bool = False  # the model reads images (OpenAI image parts); Discord sends them


class RateLimit(_Strict):
    messages: int = Field(6, ge=1, le=10_000)
    per_seconds: float = Field(60.0, gt=0, le=86_400)


class BotConfig(_Strict):
    name: str = Field("meshsage", min_length=1, max_length=40)
    system_prompt: str = Field(DEFAULT_SYSTEM_PROMPT, min_length=1)
    command_prefix: str = Field("!", min_length=1, max_length=3)
    operators: tuple[str, ...] = ()  # "transport:person", e.g. "meshtastic:!1234abcd"
    rate_limit: RateLimit = RateLimit()
    queue_limit: int = Field(3, ge=1, le=100)  # turns waiting per person before we say "slow down"
    max_message_chars: int = Field(4000, ge=100, le=100_000)  # longer inbound text is cut

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for op in v:
            if ":" not in op:
                raise ValueError(f"{op!r} must be 'transport:person', e.g. 'console:alice'")
        return v


class RetrievalConfig(_Strict):
    enabled: bool = True
    share: float = Field(0.4, ge=0, le=0.9)  # of the free budget kept for recall (strong match)
    # Share (0-1) of the query's IDF mass a turn or its neighbours must match to be retrieved.
    min_score: float = Field(0.2, ge=0, le=1)
    max_turns: int = Field(40, ge=0, le=200)
    k1: float = Field(1.2, ge=0, le=5)  # BM25 term-frequency saturation
    b: float = Field(0.4, ge=0, le=1)  # BM25 length normalisation (low: chat turns are short)
    neighbour: float = Field(0.6, ge=0, le=1)  # share of the better adjacent turn's score


class SummaryConfig(_Strict):
    enabled: bool = True
    min_evicted: int = Field(6, ge=2, le=1000)  # unsummarized old messages before a refresh
    max_tokens: int = Field(200, ge=32, le=4000)
    retry_seconds: float = Field(300.0, ge=1, le=86_400)


class EmbeddingsConfig(_Strict):
    """Optional vector search next to FTS5; off by default (a Pi does fine on words alone)."""

    enabled: bool = False
    model: str = "nomic-embed-text"
    base_url: str | None = None  # None: the same server as llm.base_url
    api_key_env: str | None = None  # None: the same variable as llm.api_key_env
    # Short: the new message is embedded on the reply path, and retrieval falls back to words.
    connect_timeout: float = Field(2.0, gt=0, le=60)
    read_timeout: float = Field(10.0, gt=0, le=600)
    batch: int = Field(32, ge=1, le=1024)  # messages per request when indexing
    weight: float = Field(0.5, ge=0, le=1)  # share of the vector score in the hybrid ranking
    # The longest a reply waits for the new message's vector before ranking by words alone.
    query_timeout: float = Field(1.0, gt=0, le=60)
    # Cosine similarity at which a turn is retrieved without sharing a word with the message.
    min_similarity: float = Field(0.3, ge=-1, le=1)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name an embedding model the server has (e.g. nomic-embed-text)")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError("must be the name of an environment variable, e.g. OPENAI_API_KEY")
        return v

    def endpoint(self, llm: Endpoint) -> tuple[str, str | None]:
        """(base_url, api_key_env) with the LLM's values where this section leaves them out."""
        return (
            self.base_url or llm.base_url,
            self.api_key_env if self.api_key_env is not None else llm.api_key_env,
        )


class MemoryConfig(_Strict):
    retrieval: RetrievalConfig = RetrievalConfig()
    summary: SummaryConfig = SummaryConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    max_facts: int = Field(20, ge=1, le=500)
    retention_days: int = Field(0, ge=0, le=36_500)  # 0 keeps everything
    # A session ends after this many idle seconds (or at !reset); closed sessions get a short
    # summary, and facts are extracted from them, in the background.
    session_gap: float = Field(6 * 3600.0, ge=60.0, le=90 * 86_400.0)
    extract_facts: bool = True
    # Forgetting by use: keep at most this many messages per person and space, dropping the
    # least retrieved, oldest first (never !pin-ned turns or sources of pinned facts); 0 = off.
    max_turns_per_person: int = Field(0, ge=0, le=10_000_000)


class DeliveryConfig(_Strict):
    """The durable outbox, per transport: how old an undelivered reply may get before it is
    dropped (marked expired) instead of sent after an outage or restart."""

    max_age: float = Field(3600.0, ge=0, le=30 * 86_400)


class TransportBase(_Strict):
    enabled: bool = True
    delivery: DeliveryConfig = DeliveryConfig()
    context_tokens: int = Field(2048, ge=256, le=1_000_000)
    max_tokens: int = Field(400, ge=16, le=100_000)


class ConsoleConfig(TransportBase):
    user: str = Field(default_factory=lambda: _login_name(), min_length=1)


# --- meshtastic: section (transport adapter in bot/transports/meshtastic.py) -----------------
class MeshtasticConfig(TransportBase):
    """Every key is documented in config.example.yaml; times are seconds."""

    context_tokens: int = Field(1536, ge=256, le=1_000_000)
    max_tokens: int = Field(120, ge=16, le=4000)
    # link
    connection: Literal["serial", "tcp", "ble"] = "serial"
    device: str | None = None  # serial: /dev/serial/by-id/... (required for serial)
    host: str | None = None  # tcp: WiFi node or meshtasticd (required for tcp)
    port: int = Field(4403, ge=1, le=65535)
    address: str | None = None  # ble: MAC address or device name (required for ble)
    connect_timeout: float = Field(60.0, ge=1, le=600)
    call_timeout: float = Field(60.0, ge=0.1, le=600)  # one library call; longer means reconnect
    reconnect_initial: float = Field(5.0, gt=0, le=3600)
    reconnect_max: float = Field(300.0, gt=0, le=86_400)
    stale_after: float = Field(900.0, ge=0, le=86_400)  # quiet this long -> probe; 0 disables
    probe_timeout: float = Field(30.0, gt=0, le=600)
    # receiving
    channels: tuple[int, ...] = ()  # channel indexes where triggers are answered; () = DMs only
    trigger: str | None = Field(None, min_length=1, max_length=40)  # default "@<bot.name>"
    prefix_trigger: bool = True  # a channel message starting with the command prefix triggers
    ignore_nodes: tuple[str, ...] = ()  # other bots and relays never answered ("!1234abcd")
    ignore_mqtt: bool = True
    dedup_seconds: float = Field(120.0, ge=0, le=86_400)
    channel_cooldown: float = Field(60.0, ge=0, le=86_400)  # per person, extra triggers ignored
    # sending
    reply_in_channel: bool = True  # False: answer channel triggers by DM
    # between any two packets on air
    spacing_seconds: float = Field(3.0, ge=MIN_PACKET_SPACING_SECONDS, le=120)
    max_parts: int = Field(3, ge=1, le=9)
    chunk_bytes: int = Field(200, ge=60, le=200)
    hop_limit: int | None = Field(None, ge=0, le=7)  # None: the node's own setting
    cooldown: float = Field(15.0, ge=0, le=3600)  # per person, between consecutive replies
    want_ack: bool = True  # DMs only; broadcasts get no end-to-end ACK
    ack_timeout: float = Field(45.0, gt=0, le=600)
    ack_retries: int = Field(2, ge=0, le=10)
    ack_backoff: float = Field(10.0, ge=0, le=600)  # before the first re-send; doubles
    # Transmissions one reply may cost, the firmware's own retransmissions included (each
    # unacknowledged part costs 1 + 3); re-sends stop when the next would exceed it.
    airtime_budget: int = Field(24, ge=1, le=1000)
    busy_threshold: float = Field(20.0, gt=0, le=100)  # channel utilization %, slow/hold above
    busy_max_wait: float = Field(120.0, ge=0, le=3600)  # held this long: back to the outbox
    busy_poll: float = Field(10.0, gt=0, le=600)
    duty_cycle: float = Field(10.0, gt=0, le=100)  # % of each hour the bot may transmit
    modem_preset: Literal[
        "LONG_FAST", "LONG_MODERATE", "LONG_SLOW", "MEDIUM_FAST", "MEDIUM_SLOW", "SHORT_FAST",
        "SHORT_SLOW",
    ] = "LONG_FAST"  # fmt: skip
    outbox_limit: int = Field(20, ge=1, le=1000)  # replies not started; more get "busy"
    queue_wait: float = Field(600.0, gt=0, le=86_400)  # then the reply waits in the database

    @field_validator("channels")
    @classmethod
    def _channels(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        for ch in v:
            if not 0 <= ch <= 7:
                raise ValueError(f"channel index {ch} must be 0-7 (0 is the primary channel)")
        return tuple(sorted(set(v)))

    @field_validator("ignore_nodes")
    @classmethod
    def _nodes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for node in v:
            text = node.strip().lower()
            if not re.fullmatch(r"!?[0-9a-f]{8}", text):
                raise ValueError(f"{node!r} must be a node id like '!1234abcd'")
            out.append("!" + text.lstrip("!"))
        return tuple(out)

    @model_validator(mode="after")
    def _backoff(self) -> MeshtasticConfig:
        if self.reconnect_initial > self.reconnect_max:
            raise ValueError("reconnect_initial must not exceed reconnect_max")
        return self

    def link_problem(self) -> str | None:
        """What is missing to open the radio link (checked when the transport is built)."""
        needed = {"serial": "device", "tcp": "host", "ble": "address"}[self.connection]
        if getattr(self, needed):
            return None
        example = {
            "device": "device: /dev/serial/by-id/usb-...",
            "host": "host: 192.168.1.50",
            "address": "address: AA:BB:CC:DD:EE:FF",
        }[needed]
        return f"meshtastic: connection: {self.connection} needs '{needed}'. Fix: add {example}"


# --- discord: section (transport adapter in bot/transports/discord.py) ------------------------
Snowflake = Annotated[int, Field(gt=0, lt=2**64)]  # a Discord id (user, channel, role)


class CatchUpConfig(_Strict):
    """After a restart or a session Discord could not resume: read what was missed."""

    max_age: float = Field(6 * 3600.0, ge=0, le=14 * 86400)  # seconds back; 0 turns it off
    max_messages: int = Field(50, ge=0, le=1000)  # per channel (DM or allowed channel)


class DiscordConfig(TransportBase):
    context_tokens: int = Field(4096, ge=256, le=1_000_000)
    max_tokens: int = Field(800, ge=16, le=100_000)
    # Discord keeps the conversation on screen: a day-old answer still reads in context.
    delivery: DeliveryConfig = DeliveryConfig(max_age=86_400.0)
    token_env: str = Field("DISCORD_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    dms: bool = True  # answer direct messages
    channels: tuple[Snowflake, ...] = ()  # guild channels (or thread parents) where @mentions work
    reply_trigger: bool = True  # a reply to one of the bot's messages counts as addressing it
    allowed_users: tuple[Snowflake, ...] = ()  # when set, only these users (DMs and guilds)
    blocked_users: tuple[Snowflake, ...] = ()
    allowed_roles: tuple[Snowflake, ...] = ()  # when set, guild authors need one of these roles
    blocked_roles: tuple[Snowflake, ...] = ()
    message_content_intent: bool = True  # privileged; without it, replies without a ping are empty
    max_parts: int = Field(4, ge=1, le=10)  # messages per answer; longer answers are cut
    login_timeout: float = Field(30.0, gt=0, le=600)
    retry_initial: float = Field(2.0, gt=0, le=300)  # first wait after a failed login (network)
    retry_max: float = Field(300.0, gt=0, le=3600)  # longest wait between login attempts
    remembered_messages: int = Field(1000, ge=10, le=100_000)  # inbound messages we can reply to
    # bytes per upload message; Discord's default is 10 MiB (boosted servers allow more)
    upload_limit: int = Field(10 * 1024 * 1024, ge=64 * 1024, le=500 * 1024 * 1024)
    catch_up: CatchUpConfig = CatchUpConfig()
    stream: bool = True  # answers appear and grow by message edits
    stream_edit_seconds: float = Field(1.5, ge=0.2, le=60)  # least time between two edits


class RelayPair(_Strict):
    """One mesh channel mirrored to one Discord channel."""

    mesh_channel: int = Field(ge=0, le=7)
    discord_channel: Snowflake
    direction: Literal["both", "mesh_to_discord", "discord_to_mesh"] = "both"


class RelayConfig(_Strict):
    """The mesh <-> Discord bridge. Nothing is relayed unless a pair is listed."""

    pairs: tuple[RelayPair, ...] = ()
    webhook: bool = True  # post mesh text through a channel webhook (node name as author)
    mqtt: bool = False  # also relay packets that reached the radio through MQTT
    addressed: bool = False  # also relay messages addressed to the AI (trigger or command)
    max_parts: int = Field(2, ge=1, le=9)  # mesh packets per relayed Discord message
    author_messages: int = Field(3, ge=1, le=1000)  # per Discord author per author_seconds
    author_seconds: float = Field(60.0, gt=0, le=86400)
    channel_messages: int = Field(10, ge=1, le=10000)  # per paired channel per channel_seconds
    channel_seconds: float = Field(300.0, gt=0, le=86400)
    show_signal: bool = False  # add hops and SNR to mesh -> Discord posts


class StorageConfig(_Strict):
    """Where the memory lives. Leave out for SQLite in ``state_dir`` (the Pi default); a
    ``postgresql://user@host:port/database`` URL lets several gateways share one memory."""

    url: str | None = None  # sqlite:///path/to/file.db or postgresql://user@host/db
    password_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # This gateway's name in a shared database: it delivers its own undelivered replies after
    # a restart. Keep it stable and unique per gateway. Default: host name and state_dir.
    gateway: str | None = Field(None, min_length=1, max_length=200)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        scheme, sep, rest = v.partition("://")
        if not sep or scheme not in ("sqlite", "postgresql", "postgres"):
            raise ValueError(
                "must start with sqlite:/// (a file) or postgresql:// "
                "(e.g. postgresql://meshsage@db.lan/meshsage)"
            )
        creds = rest.split("/", 1)[0].rpartition("@")[0]
        if ":" in creds:
            raise ValueError(
                "must not contain a password: put it in an environment variable and name that "
                "variable in storage.password_env (e.g. password_env: MESHSAGE_PG_PASSWORD)"
            )
        if scheme == "sqlite" and not rest.removeprefix("/"):
            raise ValueError("must name a file, e.g. sqlite:///var/lib/meshsage/meshsage.db")
        return v

    @property
    def postgres(self) -> bool:
        return self.url is not None and self.url.startswith(("postgresql://", "postgres://"))


class Config(_Strict):
    state_dir: Path | None = None  # default: $XDG_DATA_HOME/meshsage (~/.local/share/meshsage)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    llm: LLMConfig = LLMConfig()
    bot: BotConfig = BotConfig()
    memory: MemoryConfig = MemoryConfig()
    console: ConsoleConfig | None = None
    meshtastic: MeshtasticConfig | None = None
    discord: DiscordConfig | None = None
    relay: RelayConfig = RelayConfig()
    storage: StorageConfig = StorageConfig()
    _source: str = PrivateAttr("<defaults>")
    _env_keys: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> str:
        """The file this config was read from, or "<defaults>"."""
        return self._source

    def origin(self, key: str) -> str:
        """Where ``key`` (dotted path) got its value: "VAR (environment)" or "FILE: key"."""
        var = self._env_keys.get(key)
        if var is not None:
            return f"environment variable {var}"
        return f"{self._source}: {key}"

    @property
    def database_path(self) -> Path:
        """The SQLite file (``storage.url: sqlite:///...`` or the state dir's meshsage.db);
        with PostgreSQL, its directory still holds exports and the status file."""
        url = self.storage.url
        if url is not None and url.startswith("sqlite://"):
            return Path(url.removeprefix("sqlite://"))
        return (self.state_dir or default_state_dir()) / "meshsage.db"

    def enabled_transports(self) -> list[str]:
        """Sections present and not disabled; the console when no transport is configured."""
        present = {
            name: section
            for name, section in (
                ("console", self.console),
                ("meshtastic", self.meshtastic),
                ("discord", self.discord),
            )
            if section is not None
        }
        if not present:
            return ["console"]
        return [name for name, section in present.items() if section.enabled]

    def console_config(self) -> ConsoleConfig:
        return self.console or ConsoleConfig()


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "meshsage"


def load_config(path: str | Path | None = None, *, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and apply environment overrides. ``path=None`` uses MESHSAGE_CONFIG."""
    env = os.environ if env is None else env
    if path is None:
        path = env.get(ENV_CONFIG) or None
    raw: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        raw = _read_yaml(Path(path), from_env=path == env.get(ENV_CONFIG))
    for section in ("console", "meshtastic", "discord"):
        if section in raw and raw[section] is None:
            raw[section] = {}  # "meshtastic:" with nothing under it means "on, with defaults"
    raw, env_keys = _apply_env(raw, env)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_explain(source, exc, env_keys)) from None
    config._source = source
    config._env_keys = env_keys
    return config


def _read_yaml(path: Path, *, from_env: bool = False) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if from_env:
            raise ConfigError(
                f"{path}: file not found (environment variable {ENV_CONFIG} names it). Fix: "
                "create it from config.example.yaml (systemd/install.sh writes one); in a "
                "container, mount the directory holding config.yaml, e.g. "
                '-v "$PWD/config:/config:ro".'
            ) from None
        raise ConfigError(
            f"{path}: file not found. Fix: pass an existing file, or copy config.example.yaml "
            "to it, or run without --config to use the defaults."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot read ({exc}). Fix: check permissions/encoding."
        ) from None
    try:
        data = load_unique(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(getattr(exc, "problem", exc))
        if "appears twice" in problem:
            raise ConfigError(f"{path}:{where}: {problem}.") from None
        raise ConfigError(
            f"{path}:{where}: not valid YAML ({problem}). Fix: check indentation and quoting there."
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections (llm:, bot:, ...), "
            f"not a {type(data).__name__}. Fix: see config.example.yaml."
        )
    return data


def _apply_env(
    raw: dict[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's values with the environment's on top, and which key each variable set."""
    raw = dict(raw)
    used: dict[str, str] = {}
    if env.get(ENV_STATE_DIR):
        raw["state_dir"] = env[ENV_STATE_DIR]
        used["state_dir"] = ENV_STATE_DIR
    llm_over = {}
    for key, var in (("base_url", ENV_LLM_BASE_URL), ("model", ENV_LLM_MODEL)):
        if env.get(var):
            llm_over[key] = env[var]
            used[f"llm.{key}"] = var
    if llm_over:
        llm = raw.get("llm")
        raw["llm"] = {**(llm if isinstance(llm, dict) else {}), **llm_over}
    return raw, used


def _model_at(path: tuple[int | str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = Config
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            continue  # list indexes and union branches do not change the model we look at
        ann = model.model_fields[part].annotation
        model = _first_model(ann)
    return model


def _first_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _explain(source: str, exc: ValidationError, env_keys: Mapping[str, str]) -> str:
    lines = [f"{source}: invalid configuration ({exc.error_count()} problem(s)):"]
    for err in exc.errors():
        loc = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and p[:1].isupper())
        )  # drop pydantic's union-branch labels such as 'MeshtasticConfig'
        key = ".".join(str(p) for p in loc) or "(top level)"
        kind = err["type"]
        var = env_keys.get(key)
        if kind == "extra_forbidden":
            parent = _model_at(loc[:-1])
            valid = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            lines.append(
                f"  {key}: unknown key. Fix: {hint}remove it; valid keys here: {', '.join(valid)}"
            )
        elif kind == "missing":
            lines.append(f"  {key}: required. Fix: add it (see config.example.yaml)")
        else:
            got = err.get("input")
            shown = repr(got) if not isinstance(got, dict) else "a mapping"
            need = _plain(kind, err.get("ctx") or {}, err["msg"])
            if var is not None:
                lines.append(
                    f"  {key} (from environment variable {var}): {need} (got {shown}). "
                    f"Fix: change {var} where it is set (the unit's Environment=, "
                    "/etc/meshsage/env, or the container's environment)"
                )
            else:
                lines.append(f"  {key}: {need} (got {shown}). Fix: change {key} in {source}")
    return "\n".join(lines)


def _plain(kind: str, ctx: Mapping[str, Any], msg: str) -> str:
    """The requirement behind a validation error, in words an operator uses."""
    simple = {
        "int_parsing": "must be a whole number, e.g. 3",
        "int_type": "must be a whole number, e.g. 3",
        "int_from_float": "must be a whole number, e.g. 3",
        "float_parsing": "must be a number, e.g. 2.5",
        "float_type": "must be a number, e.g. 2.5",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "string_type": "must be text (put it in quotes)",
        "dict_type": "must be a section: indented key: value lines under it",
        "model_type": "must be a section: indented key: value lines under it",
        "model_attributes_type": "must be a section: indented key: value lines under it",
        "tuple_type": "must be a list, e.g. [1, 2] or one '- item' line per entry",
        "list_type": "must be a list, e.g. [1, 2] or one '- item' line per entry",
        "string_pattern_mismatch": "must be the name of an environment variable, e.g. MY_TOKEN",
        "path_type": "must be a directory path, e.g. /var/lib/meshsage",
    }
    if kind in simple:
        return simple[kind]
    bounds = {
        "greater_than": "must be greater than {gt}",
        "greater_than_equal": "must be {ge} or more",
        "less_than": "must be less than {lt}",
        "less_than_equal": "must be {le} or less",
        "string_too_short": "must be at least {min_length} character(s) long",
        "string_too_long": "must be at most {max_length} characters long",
        "too_short": "must have at least {min_length} item(s)",
        "too_long": "must have at most {max_length} items",
    }
    if kind in bounds:
        shown = {
            k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in ctx.items()
        }
        with contextlib.suppress(KeyError, IndexError):
            return bounds[kind].format(**shown)
    if kind == "literal_error" and "expected" in ctx:
        return f"must be one of {ctx['expected']}"
    if msg.startswith("Input should be "):
        return "must be " + msg.removeprefix("Input should be ").replace("valid ", "")
    return msg.removeprefix("Value error, ").strip()
