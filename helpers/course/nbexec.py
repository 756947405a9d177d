"""Executing the notebooks with nbclient (``./workbook refresh``, the student-edition tests) without
lost replies: a kernel manager whose client notices a reply that arrived while it was sending.

The stall it removes (measured under load on the 2-core machine): a cell with an ipywidgets
``interact`` finished in the kernel, but ``jupyter nbconvert --execute`` went on waiting for its
reply until the cell timeout (600 s), then carried on without an error, as if the cell had taken
that long. The cause is in the client, not the kernel nor the launcher:

* nbclient mimics an ``Output`` widget: each output captured by one (``interact`` captures its
  function's figure) is sent back to the kernel as a ``comm_msg`` on the shell channel, while
  nbclient waits on that same channel for the cell's ``execute_reply``;
* jupyter_client's ``Session.send`` writes through a synchronous shadow of the asyncio socket, and
  libzmq then processes the socket's pending commands, which resets its edge-triggered ``ZMQ_FD``;
* when the reply had arrived just before that send, the event loop is never woken for it (zmq.asyncio
  did not see the send, so it does not look again) and the reply waits in the socket until the
  poll's timeout, when pyzmq makes one last level-triggered check and finds it.

:class:`KernelManager` gives nbclient a client whose channels read ``ZMQ_EVENTS`` through the
asyncio socket after every send, which makes zmq.asyncio schedule the reply's delivery. Use it as
``NotebookClient(nb, kernel_manager_class=KernelManager)`` or
``jupyter nbconvert --execute --ExecutePreprocessor.kernel_manager_class=helpers.course.nbexec.KernelManager``.
(nbval runs its kernel through a blocking client, whose polls are level-triggered: not affected.)

**No TCP ports to race for.** jupyter_client picks a kernel's five TCP ports by binding port 0 and
closing it; the kernel binds them a moment later. Another process may take one in between: a
suite run's launches open TCPStores and gloo connections on ephemeral ports all the time, and once
an nbval kernel died before it could answer ("Kernel died before replying to kernel_info"; 29 cells
of 12.1.1 errored). These kernel managers talk to their kernels over Unix sockets in a private
temporary folder instead (``transport="ipc"``): :class:`KernelManager` (nbclient's, for
``./workbook refresh`` and the student-edition tests) and :class:`BlockingKernelManager` (the root
conftest.py gives it to nbval).
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid

import zmq
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.manager import KernelManager as _BlockingKernelManager
from traitlets import DottedObjectName, Type

_FOLDER: list = []  # the private folder of this process's kernel sockets, made on first use


def ipc_prefix() -> str:
    """A fresh path prefix for one kernel's sockets (``prefix-<n>``, one per channel) in a folder of
    this process's own, removed when it exits."""
    if not _FOLDER:
        _FOLDER.append(tempfile.mkdtemp(prefix="workbook-kernels-"))
        atexit.register(shutil.rmtree, _FOLDER[0], True)
    return os.path.join(_FOLDER[0], uuid.uuid4().hex[:12])


class _OverIPC:
    """A kernel manager whose kernel listens on Unix sockets under :func:`ipc_prefix` (module docstring)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("transport", "ipc")
        if kwargs["transport"] == "ipc":
            kwargs.setdefault("ip", ipc_prefix())
        super().__init__(**kwargs)


class Channel(AsyncZMQSocketChannel):
    """A request/reply channel that re-arms zmq.asyncio after each send (see the module docstring)."""

    def send(self, msg: dict) -> None:
        super().send(msg)
        if self.socket is not None:
            # zmq.asyncio's get(EVENTS) schedules the handling of any message already waiting
            self.socket.get(zmq.EVENTS)


class KernelClient(AsyncKernelClient):
    """nbclient's usual asynchronous client, with :class:`Channel` for the channels it sends on."""

    shell_channel_class = Type(Channel)
    control_channel_class = Type(Channel)
    stdin_channel_class = Type(Channel)


class KernelManager(_OverIPC, AsyncKernelManager):
    """nbclient's usual kernel manager, handing out :class:`KernelClient`, its kernel over IPC."""

    client_class = DottedObjectName("helpers.course.nbexec.KernelClient")
    client_factory = Type(KernelClient)  # AsyncKernelManager fixes this one too, not only the name


class BlockingKernelManager(_OverIPC, _BlockingKernelManager):
    """jupyter_client's blocking kernel manager (nbval's), its kernel over IPC."""
