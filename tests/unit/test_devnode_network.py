"""Pod addresses and the hosts file of the dev node."""

from __future__ import annotations

import pytest

from phalanx.devnode.network import (
    IpPool,
    PodAddress,
    default_ip_prefix,
    peer_pod_addresses,
    pod_names,
    render_hosts,
)

pytestmark = pytest.mark.unit


def test_addresses_are_unique_per_pod_and_not_reused_at_once() -> None:
    pool = IpPool("127.9.9")
    first, second = pool.allocate("uid-a"), pool.allocate("uid-b")
    assert (first, second) == ("127.9.9.2", "127.9.9.3")
    assert pool.allocate("uid-a") == first  # asking twice for one pod gives the same address
    pool.release("uid-a")
    # A freed address waits its turn: its ports may still be in TIME_WAIT.
    assert pool.allocate("uid-c") == "127.9.9.4"


def test_allocation_wraps_around_to_freed_addresses() -> None:
    pool = IpPool("127.9.9")
    for index in range(253):
        pool.allocate(f"uid-{index}")
    pool.release("uid-5")
    assert pool.allocate("uid-new") == "127.9.9.7"


def test_a_full_pool_says_so() -> None:
    pool = IpPool("127.9.9")
    for index in range(253):
        pool.allocate(f"uid-{index}")
    with pytest.raises(RuntimeError, match="no free pod address"):
        pool.allocate("one-too-many")


def test_a_malformed_prefix_is_refused() -> None:
    with pytest.raises(ValueError):
        IpPool("127.300.1")


def test_default_prefix_stays_in_loopback_and_differs_between_seeds() -> None:
    prefixes = {default_ip_prefix(f"/state/{n}") for n in range(20)}
    assert all(p.startswith("127.") and not p.startswith("127.0.") for p in prefixes)
    assert len(prefixes) > 15
    assert default_ip_prefix("same") == default_ip_prefix("same")


def test_a_pod_with_a_subdomain_answers_to_its_cluster_dns_names() -> None:
    names = pod_names(PodAddress("127.9.9.2", "job-worker-0", "job", "team-a"))
    assert names == [
        "job-worker-0.job.team-a.svc.cluster.local",
        "job-worker-0.job.team-a.svc",
        "job-worker-0.job.team-a",
        "job-worker-0.job",
        "job-worker-0",
    ]
    assert pod_names(PodAddress("127.9.9.3", "lonely", "", "team-a")) == ["lonely"]


def test_hosts_file_has_an_ipv4_and_a_v4_mapped_ipv6_line_per_pod_after_the_machines_own() -> None:
    text = render_hosts(
        [PodAddress("127.9.9.3", "b", "svc", "ns"), PodAddress("127.9.9.2", "a", "svc", "ns")],
        host_lines="# comment\n127.0.0.1 localhost\n",
    )
    lines = text.splitlines()
    assert lines[0] == "127.0.0.1 localhost"
    assert lines[1].startswith("127.9.9.2 a.svc.ns.svc.cluster.local ")
    assert lines[2].startswith("::ffff:127.9.9.2 a.svc.ns.svc.cluster.local ")
    assert lines[3].startswith("127.9.9.3 b.svc.ns.svc.cluster.local ")
    assert len(lines) == 5


def pod(
    name: str, ip: str, phase: str = "Running", subdomain: str = "job", deleted_at: str = ""
) -> dict[str, object]:
    deletion = {"deletionTimestamp": deleted_at} if deleted_at else {}
    return {
        "metadata": {"name": name, "namespace": "ns", **deletion},
        "spec": {"hostname": name, "subdomain": subdomain},
        "status": {"podIP": ip, "phase": phase},
    }


def test_the_running_pods_of_other_dev_nodes_are_listed_and_simulated_ones_are_not() -> None:
    found = peer_pod_addresses([
        pod("on-another-agent", "127.9.8.2"),
        pod("on-kwok", "10.0.0.7"),  # a simulated node's address: nothing here answers it
        pod("not-started", ""),
        pod("ended", "127.9.8.3", phase="Succeeded"),
    ])  # fmt: skip
    assert found == [PodAddress("127.9.8.2", "on-another-agent", "job", "ns")]
    assert "on-another-agent.job.ns.svc.cluster.local" in render_hosts(found)


def test_a_peer_pod_being_deleted_is_left_out() -> None:
    going = pod("going", "127.9.8.4", deleted_at="2026-12-01T00:00:00Z")  # still Running, until it ends
    assert peer_pod_addresses([going, pod("staying", "127.9.8.5")]) == [
        PodAddress("127.9.8.5", "staying", "job", "ns")
    ]


def test_this_agents_own_pods_come_before_the_peers_so_a_short_name_resolves_to_its_own_pod() -> None:
    # nss_wrapper answers with the first matching line: "worker-0.job" must be this agent's pod,
    # even where a peer's namespace sorts first.
    own = PodAddress("127.9.9.2", "worker-0", "job", "zz-own")
    peer = PodAddress("127.9.8.2", "worker-0", "job", "aa-peer")
    lines = render_hosts([own], peers=[peer]).splitlines()
    first_short = next(line for line in lines if " worker-0.job " in f"{line} ")
    assert first_short.startswith("127.9.9.2 "), lines
    assert any(line.startswith("127.9.8.2 ") for line in lines), lines
