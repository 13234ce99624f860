"""The test S3 server (tests/fixtures/s3.py) starts when a port it chose is taken before weed binds it.

CI once lost a run to this: `weed mini` exited with "port 50888 for Master ... is not available" because the port,
drawn from the kernel's ephemeral range, was taken between the choice and the bind.
"""

from __future__ import annotations

import socket
from pathlib import Path

from fixtures.s3 import S3Server, _ephemeral_floor


def test_ports_are_drawn_below_the_ephemeral_range_and_a_taken_one_is_redrawn(tmp_path: Path) -> None:
    server = S3Server(tmp_path)
    assert all(port < _ephemeral_floor() for port in server.ports.values()), server.ports
    chosen = server.ports["master.port"]
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", chosen))
    squatter.listen()
    try:
        server.start()
        assert server.ports["master.port"] != chosen and server.endpoint.endswith(f":{server.ports['s3.port']}")
        name = server.create_bucket()
        server.client().put_object(Bucket=name, Key="k", Body=b"v")

        ports = dict(server.ports)
        server.stop()
        server.start()
        assert server.ports == ports, "a restarted server keeps its address"
        assert server.client().get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    finally:
        server.stop()
        squatter.close()
