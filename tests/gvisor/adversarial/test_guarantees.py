"""The adversarial suite's proofs of the egress and isolation guarantees, on gvisor sandboxes."""

from __future__ import annotations

import platform

import pytest

from tests.adversarial.conftest import Attacker
from tests.adversarial.test_credentials import (  # noqa: F401 (collected here on gvisor)
    test_echoed_credential_is_scrubbed_in_headers_and_chunked_bodies,
    test_redirects_never_carry_the_credential_elsewhere,
)
from tests.adversarial.test_identity import (  # noqa: F401
    test_forged_destination_is_ignored_the_proxy_dials_its_own_resolution,
    test_ip_literal_urls_are_refused,
    test_ipv6_has_no_route_and_v4_mapped_literals_are_ip_literals,
)
from tests.adversarial.test_network import (  # noqa: F401
    test_another_sandbox_is_unreachable,
    test_icmp_gets_no_answer,
    test_ipv6_is_off_inside,
    test_the_hosts_other_services_are_out_of_reach,
    test_the_state_dir_and_control_socket_are_not_in_the_sandbox,
    test_udp_and_quic_go_nowhere,
    victim,
)
from tests.adversarial.test_resilience import test_proxy_crash_mid_stream_fails_closed_and_restarts  # noqa: F401
from tests.adversarial.test_resource_caps import (  # noqa: F401
    capped,
    test_a_disk_filler_gets_enospc_at_its_quota_and_the_state_dir_keeps_its_space,
    test_delete_and_a_failed_create_leave_no_loop_device_mount_image_or_cgroup,
)

pytestmark = pytest.mark.root


def test_the_attacker_runs_on_gvisor(attacker: Attacker) -> None:
    """The control for everything above: these sandboxes really run on gVisor's kernel."""
    assert attacker.sh("uname -r").stdout.strip() != platform.release()
    assert "Starting gVisor" in attacker.sh("dmesg").stdout
    assert attacker.isolation() == "gvisor"
