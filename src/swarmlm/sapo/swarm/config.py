"""Options of the decentralized swarm: ``swarmlm sapo node`` (one volunteer's node) and ``swarmlm sapo swarm``
(N such nodes on this machine). Both add to a SAPO node's options the swarm's identity (run name and
round clock) and the node's place on the network."""

from __future__ import annotations

import math

from pydantic import Field, field_validator, model_validator

from swarmlm.config import StrictModel, parse_list
from swarmlm.sapo.config import NodeModels, SAPOConfig, SharingSection


class SwarmSection(StrictModel):
    """What every node of one swarm must agree on, and how a node talks to it."""

    run: str = Field("swarmlm", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                     description="name of the swarm: nodes share records only with nodes of the same run")
    round_length: float = Field(30.0, gt=0, description=(
        "seconds per global round: round = floor((unix time - epoch) / round_length); the same on every node"))
    epoch: float = Field(0.0, ge=0, description="unix time at which global round 0 starts; the same on every node")
    staleness_seconds: float | None = Field(None, ge=0, description=(
        "accept records up to this many seconds old; sets sharing.staleness_rounds = ceil(seconds / round_length)"))
    wait_for_peers: bool = Field(False, description=(
        "while collecting, wait (at most sharing.collect_timeout) for peers heard within the staleness window "
        "to publish something new (fresher records, slower rounds); false = take what has arrived and go"))
    poll_interval: float = Field(0.5, gt=0, description="seconds between reads of the DHT while collecting")
    max_peers_per_round: int = Field(256, ge=1, description=(
        "most peers whose keys are read per round: those heard from recently first, then others of the routing table"))
    dht_round_bytes: int = Field(32_000_000, ge=1_000_000, description=(
        "bytes of all peers' messages of one round this node's DHT keeps (its own always; known peers before new "
        "identities, which share at most half); beyond: refused as dht_full"))
    startup_timeout: float = Field(60.0, gt=0, description="seconds to wait for the DHT to start and reach a peer")
    start_peers: int = Field(0, ge=0, description="before the first step, wait until this many other peers are known")
    start_wait: float = Field(120.0, ge=0, description="longest wait for start_peers (then the node starts anyway)")
    retry_initial: float = Field(2.0, gt=0, description="seconds before the first retry of unreachable initial peers")
    retry_max: float = Field(60.0, gt=0, description="longest wait between retries (the wait doubles each time)")


def _swarm_sharing() -> SharingSection:
    # Rounds are wall-clock ticks, so a node must accept records a few rounds old and never wait long.
    return SharingSection(staleness_rounds=2, collect_timeout=10.0)


class SwarmCommon(SAPOConfig):
    """The options ``sapo node`` and ``sapo swarm`` share."""

    rounds: int = Field(40, ge=1, description="training steps this node takes (its own count, not the swarm's round)")
    checkpoint_every: int = Field(5, ge=1, description="checkpoint every C steps (and at the end and on Ctrl+C)")
    out: str = Field("runs/swarm", description="output directory")
    initial_peers: list[str] = Field(default_factory=list, description=(
        "multiaddrs of peers already in the swarm, e.g. /ip4/203.0.113.7/tcp/31337/p2p/Qm...; "
        "empty = this node is the first peer and prints its address for others"))
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"], description=(
        "where the node listens; fix the port (e.g. /ip4/0.0.0.0/tcp/31337) so that others can reach it"))
    announce_maddrs: list[str] = Field(default_factory=list, description=(
        "addresses to announce to others (e.g. your public IP and port, behind NAT with a forwarded port)"))
    sharing: SharingSection = Field(default_factory=_swarm_sharing)
    swarm: SwarmSection = Field(default_factory=SwarmSection)

    _lists = field_validator("initial_peers", "host_maddrs", "announce_maddrs", mode="before")(parse_list)

    @model_validator(mode="after")
    def _staleness_in_rounds(self) -> "SwarmCommon":
        if self.swarm.staleness_seconds is not None:
            rounds = math.ceil(self.swarm.staleness_seconds / self.swarm.round_length - 1e-9)
            if self.sharing.staleness_rounds != rounds:
                self.sharing.staleness_rounds = rounds
        return self


class SwarmNodeConfig(SwarmCommon):
    """``swarmlm sapo node``: one node of a decentralized swarm, on this machine."""

    identity: str | None = Field(None, description=(
        "identity key file, which must exist unless create_identity is set; default OUT/identity.key (created if "
        "missing). Keep it to keep your peer id. A path given here that does not exist is an error, so that a typo "
        "does not start the node under a new identity"))
    create_identity: bool = Field(False, description=(
        "create a new identity key at the path given by identity if no file is there"))
    node_index: int | None = Field(None, ge=0, description="seeds this node's question stream; default: derived from the peer id")
    progress: bool = Field(True, description="show a progress bar")
    watch_pid: int | None = Field(None, ge=1, description="stop, with a checkpoint, once this process is gone (set by sapo swarm)")


class SwarmConfig(NodeModels, SwarmCommon):
    """``swarmlm sapo swarm``: N node processes on this machine, over loopback, followed by one progress display."""

    nodes: int = Field(3, ge=1, description="node processes to start")
    out: str = Field("runs/swarm", description="output directory; node k writes to OUT/node-k")
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"], description="where each node listens")
    node_group_sizes: list[int] = Field(default_factory=list, description=(
        "L of node k = node_group_sizes[k % len]; empty = generation.group_size for all"))
    threads_per_node: int = Field(0, ge=0, description="torch threads per node process; 0 = CPU cores / nodes")
    startup_wait: float = Field(300.0, gt=0, description="seconds to wait for the first node to print its address")

    # its own name: one named _node_lists would replace NodeModels' validator of node_models and node_families
    _group_size_list = field_validator("node_group_sizes", mode="before")(parse_list)

    @field_validator("node_group_sizes")
    @classmethod
    def _group_sizes(cls, value: list[int]) -> list[int]:
        if any(v < 2 for v in value):
            raise ValueError("every L must be at least 2")
        return value
