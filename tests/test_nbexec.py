"""helpers.course.nbexec: nbclient's channel notices a reply that arrived just before it sent something.

The scene of the stall, staged without a kernel: the client waits for a reply on an asyncio
DEALER socket; the reply reaches the socket while the event loop is busy; then, before the loop
looks again, the client sends on the same socket (as nbclient's Output-widget mimic does in an
``interact`` cell). With jupyter_client's own channel the reply is then not delivered until the
poll times out; with :class:`helpers.course.nbexec.Channel` it is delivered at once.
"""
import asyncio
import select
import time

import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from helpers import nbexec


async def _reply_after_a_send(channel_class) -> bool:
    """True when the reply is delivered without waiting for the poll's timeout."""
    session = Session(key=b"")
    server = zmq.Context.instance().socket(zmq.ROUTER)
    client = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    try:
        server.linger = client.linger = 0
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        channel = channel_class(client, session)
        channel.send(session.msg("execute_request"))
        assert server.poll(30_000), "the request never reached the stand-in kernel"
        ident, _ = session.feed_identities(server.recv_multipart())
        waiting = asyncio.ensure_future(channel.get_msg(timeout=3600))  # nbclient's wait for the reply
        for _ in range(20):  # the poll is registered and the loop is watching the socket
            await asyncio.sleep(0)
        session.send(server, "execute_reply", {"status": "ok"}, ident=ident)
        # the loop is busy (this coroutine blocks it) while the reply arrives: the socket's FD says so
        assert select.select([client.get(zmq.FD)], [], [], 30)[0], "the reply never reached the client"
        time.sleep(0.01)  # past libzmq's ~1 ms command throttle, so the send processes the commands
        channel.send(session.msg("comm_msg"))  # nbclient's Output widget syncing its state
        for _ in range(50):
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        delivered = waiting.done()
        if delivered:
            assert waiting.result()["header"]["msg_type"] == "execute_reply"
        waiting.cancel()
        return delivered
    finally:
        client.close()
        server.close()


def test_a_reply_that_arrives_before_a_send_is_delivered():
    assert asyncio.run(_reply_after_a_send(nbexec.Channel))


def test_jupyter_clients_own_channel_loses_it():
    # the defect the Channel works around; if this starts failing, jupyter_client or pyzmq has
    # fixed it and helpers.course.nbexec can go
    assert not asyncio.run(_reply_after_a_send(AsyncZMQSocketChannel))


def test_the_kernel_manager_hands_out_the_channel():
    km = nbexec.KernelManager()
    kc = km.client()
    assert kc.shell_channel_class is nbexec.Channel and kc.control_channel_class is nbexec.Channel
    assert isinstance(kc, nbexec.KernelClient)


def test_kernels_talk_over_unix_sockets_in_a_private_folder():
    """No TCP port to race for (the module docstring): the kernel's channels are socket files under
    this process's private folder while it runs, and are gone when it is shut down."""
    import os

    km = nbexec.BlockingKernelManager(kernel_name="python3")
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("x = 6 * 7", timeout=60)
        assert reply["content"]["status"] == "ok"
        info = km.get_connection_info()
        assert info["transport"] == "ipc" and os.path.dirname(info["ip"]) == nbexec._FOLDER[0]
        sockets = [f"{info['ip']}-{info[k]}" for k in ("shell_port", "iopub_port", "stdin_port", "hb_port",
                                                      "control_port")]
        assert all(os.path.exists(s) for s in sockets)
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    assert not any(os.path.exists(s) for s in sockets)


def test_nbval_starts_its_kernels_with_them():
    import nbval.kernel

    assert nbval.kernel.KernelManager is nbexec.BlockingKernelManager
