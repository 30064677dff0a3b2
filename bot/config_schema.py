"""The configuration schema: every section as a frozen, strict pydantic model with its defaults.

Loading, environment overrides and the operator-facing messages live in ``bot.config``, which
re-exports every name here (``from bot.config import X`` is how the code imports them).

Invariants:
- Every model is frozen and forbids unknown keys (``_Strict``); ranges, patterns and the
  cross-field checks (``reconnect_initial <= reconnect_max``, URLs without passwords, node ids)
  are declared here, so no part of the program can hold an out-of-range value.
- Secrets never come from YAML: only the *name* of an environment variable is configured
  (``api_key_env``, ``token_env``, ``password_env``); the value is read from the environment
  when needed.
- No file at all is valid: the defaults run the console transport against Ollama on localhost.
- A ``Config`` remembers where it came from (``source``, ``origin``); the loader fills it in.
- This module imports nothing above it (no loading, no ``bot.ops``): importing it does nothing.
"""

from __future__ import annotations

import base64
import getpass
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
)

from bot.config_base import DeliveryConfig as DeliveryConfig
from bot.config_base import RadioLinkBase, _Strict
from bot.config_base import TransportBase as TransportBase
from bot.config_meshcore import MeshCoreConfig as MeshCoreConfig
from bot.config_meshcore import key_text
from bot.transports.mesh_keys import PUBLIC_KEY_BYTES
from bot.transports.mesh_text import MIN_PACKET_SPACING_SECONDS

DEFAULT_SYSTEM_PROMPT = (
    "You are meshsage, a helpful assistant reached over chat and LoRa mesh radio. "
    "Answer briefly and plainly. Use the notes about the person and earlier conversation "
    "when they are relevant; say so when you do not know."
)


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https:// (e.g. http://localhost:11434/v1)")
    return v.rstrip("/")


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
    # "transport:person", e.g. "meshtastic:!1234abcd", "meshcore:<public key or 6+ byte prefix>"
    operators: tuple[str, ...] = ()
    rate_limit: RateLimit = RateLimit()
    queue_limit: int = Field(3, ge=1, le=100)  # turns waiting per person before we say "slow down"
    max_message_chars: int = Field(4000, ge=100, le=100_000)  # longer inbound text is cut
    # Named personas (system prompts) people may choose with !persona NAME; operators may also
    # set any text for a channel, a server or the whole bot (docs/discord.md).
    personas: dict[str, str] = Field(default_factory=dict)

    @field_validator("operators")
    @classmethod
    def _ops(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for op in v:
            if ":" not in op:
                raise ValueError(f"{op!r} must be 'transport:person', e.g. 'console:alice'")
            transport, _, person = op.partition(":")
            if transport == "meshcore":  # a public key or a 6+ byte prefix, in lower-case hex
                op = f"meshcore:{key_text(person)}"
            out.append(op)
        return tuple(out)


class RetrievalConfig(_Strict):
    enabled: bool = True
    share: float = Field(0.2, ge=0, le=0.9)  # of the free budget kept for recall (see memory.md)
    # Share (0-1) of the query's IDF mass a turn or its neighbours must match to be retrieved.
    min_score: float = Field(0.2, ge=0, le=1)
    max_turns: int = Field(40, ge=0, le=200)
    k1: float = Field(1.2, ge=0, le=5)  # BM25 term-frequency saturation
    b: float = Field(0.4, ge=0, le=1)  # BM25 length normalisation (low: chat turns are short)
    neighbour: float = Field(0.6, ge=0, le=1)  # share of the better adjacent turn's score
    # How many turns on each side of a hit are candidates and lend it score (halving with
    # distance): the "context depth" around a hit. 0: hits alone.
    context_depth: int = Field(2, ge=0, le=10)
    # Seconds of prompt evaluation a reply's recall may cost on the server, at the speed the
    # bot measures (a Pi reads tens of tokens a second); null: recall is bounded by the budget
    # only.
    recall_seconds: float | None = Field(5.0, gt=0, le=600)


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


class ConsoleConfig(TransportBase):
    user: str = Field(default_factory=lambda: _login_name(), min_length=1)


# --- meshtastic: section (transport adapter in bot/transports/meshtastic.py) -----------------
class MeshtasticConfig(RadioLinkBase):
    """Every key is documented in config.example.yaml; times are seconds."""

    SECTION = "meshtastic"

    context_tokens: int = Field(1536, ge=256, le=1_000_000)
    max_tokens: int = Field(120, ge=16, le=4000)
    # link
    host: str | None = None  # tcp: WiFi node or meshtasticd (required for tcp)
    port: int = Field(4403, ge=1, le=65535)
    connect_timeout: float = Field(60.0, ge=1, le=600)
    call_timeout: float = Field(60.0, ge=0.1, le=600)  # one library call; longer means reconnect
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
    # identity (docs/meshtastic.md, "Security"): what a DM without PKI may do with the memory
    # of the node id it claims ("chat": answered from nothing stored, nothing stored; "memory":
    # its conversation is stored and recalled), and public keys pinned up front (node id ->
    # base64 key, e.g. the operators'), which a first PKI DM can never replace.
    unauthenticated_dm: Literal["chat", "memory"] = "chat"
    pinned_keys: dict[str, str] = Field(default_factory=dict)
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
    # Senders the bot cannot confirm (never ACKed, not authenticated; docs/meshtastic.md):
    # replies to them share this % of the duty cycle's hourly airtime, and a node the radio
    # never heard a NodeInfo or key from gets this many re-sends.
    stranger_share: float = Field(25.0, ge=0, le=100)
    stranger_retries: int = Field(0, ge=0, le=10)
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

    @field_validator("pinned_keys")
    @classmethod
    def _keys(cls, v: dict[str, str]) -> dict[str, str]:
        out = {}
        for node, key in v.items():
            text = node.strip().lower()
            if not re.fullmatch(r"!?[0-9a-f]{8}", text):
                raise ValueError(f"{node!r} must be a node id like '!1234abcd'")
            try:
                raw = base64.b64decode(key.strip(), validate=True)
            except ValueError:
                raw = b""
            if len(raw) != PUBLIC_KEY_BYTES:
                raise ValueError(
                    f"the key for {node} must be the node's {PUBLIC_KEY_BYTES}-byte public key "
                    "in base64, as `meshtastic --info` shows it (user.publicKey)"
                )
            out["!" + text.lstrip("!")] = key.strip()
        return out


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
    # Slash commands (/reset, /history ...) registered at start, next to the !commands; empty
    # slash_guilds: for every server and DMs (global), else only in those servers (at once).
    slash_commands: bool = True
    slash_guilds: tuple[Snowflake, ...] = ()
    # A thread where the bot was @mentioned (in an allowed channel) is followed: every message
    # there is answered, no mention needed, until "!stop" there, the thread is archived, or
    # thread_idle seconds pass without a message.
    follow_threads: bool = True
    thread_idle: float = Field(86_400.0, gt=0, le=30 * 86_400)
    open_threads: bool = False  # answer a channel @mention in a new thread opened from it


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
    # Mesh -> Discord: posts per mesh node and per paired channel per window; the excess is
    # posted together as one digest when the window has room (never dropped). The channel
    # default stays under Discord's limits (5 posts per 5 s, 30 webhook posts a minute).
    node_messages: int = Field(5, ge=1, le=1000)
    node_seconds: float = Field(60.0, gt=0, le=86400)
    mesh_channel_messages: int = Field(5, ge=1, le=10000)
    mesh_channel_seconds: float = Field(10.0, gt=0, le=86400)
    reactions: bool = True  # mesh tapbacks <-> Discord reactions on relayed messages


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


class WebConfig(_Strict):
    """The operator's web view and /metrics (``bot.web``); off by default. Any bind but the
    loopback needs ``token_env`` (checked when the config is loaded): pages are read-only but
    show node ids, queue depths and health, which a LAN should not see without the token."""

    enabled: bool = False
    # The environment variable holding the token (browsers: ?token=..., then a cookie;
    # scrapers: Authorization: Bearer ...). Required for any bind but 127.0.0.1/::1/localhost.
    # (Declared before ``bind``, whose check reads it.)
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    bind: str = Field("127.0.0.1", min_length=1, max_length=255)
    port: int = Field(8470, ge=0, le=65535)  # 0: any free port (tests)
    refresh: float = Field(5.0, ge=0.2, le=300)  # seconds between samples and live updates
    max_viewers: int = Field(8, ge=1, le=100)  # live (server-sent events) connections at once

    @property
    def loopback(self) -> bool:
        return self.bind in LOOPBACK_BINDS

    @field_validator("bind")
    @classmethod
    def _token_off_loopback(cls, v: str, info: ValidationInfo) -> str:
        if info.data.get("enabled") and v not in LOOPBACK_BINDS and not info.data.get("token_env"):
            raise ValueError(
                f"{v} serves the web view beyond this machine, which needs a token. Fix: set "
                "web.token_env: MESHSAGE_WEB_TOKEN and put MESHSAGE_WEB_TOKEN=<a long random "
                "string> in the env file (/etc/meshsage/env), or bind: 127.0.0.1"
            )
        return v


LOOPBACK_BINDS = frozenset({"127.0.0.1", "::1", "localhost"})


class Config(_Strict):
    state_dir: Path | None = None  # default: $XDG_DATA_HOME/meshsage (~/.local/share/meshsage)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    llm: LLMConfig = LLMConfig()
    bot: BotConfig = BotConfig()
    memory: MemoryConfig = MemoryConfig()
    console: ConsoleConfig | None = None
    meshtastic: MeshtasticConfig | None = None
    meshcore: MeshCoreConfig | None = None
    discord: DiscordConfig | None = None
    relay: RelayConfig = RelayConfig()
    storage: StorageConfig = StorageConfig()
    web: WebConfig = WebConfig()
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
                ("meshcore", self.meshcore),
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
