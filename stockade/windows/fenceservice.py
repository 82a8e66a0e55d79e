"""The egress fence service: a LocalSystem Windows service that the service control manager runs
as `python.exe -I -m stockade.windows.fenceservice` (fenceinstall.py installs it).

It starts by checking its state directory (fenceinstall.STATE: SYSTEM's and the
Administrators' alone, else it refuses to run), registering the fence's ledger kinds over the
host's firewall (wfpengine.py) and reconciling its ledger, which takes back every filter and
exemption a previous run recorded and left (a crash; a stop with a sandbox still running);
then it serves its pipe (fencepipe.py), one thread per connection (fence.serve over a
fence.Connection: the caller read from the kernel), and reconciles again every
`fence.RECONCILE_EVERY` seconds. Stopping disconnects every caller (their fences are taken
back), reconciles once more and removes Stockade's WFP sublayer and provider if nothing of the
fence is left in them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
from collections import Counter

from stockade.lifecycle.ledger import Ledger
from stockade.windows import fence, fenceinstall, fencepipe, fenceproto, identity
from stockade.windows.api import last_error, win32
from stockade.windows.fenceapi import (
    ERROR_CALL_NOT_IMPLEMENTED,
    ERROR_PIPE_CONNECTED,
    SERVICE_ACCEPT_SHUTDOWN,
    SERVICE_ACCEPT_STOP,
    SERVICE_CONTROL_INTERROGATE,
    SERVICE_CONTROL_SHUTDOWN,
    SERVICE_CONTROL_STOP,
    SERVICE_RUNNING,
    SERVICE_START_PENDING,
    SERVICE_STOP_PENDING,
    SERVICE_STOPPED,
    SERVICE_WIN32_OWN_PROCESS,
    fence_win32,
    now,
)
from stockade.windows.fwpstructs import SERVICE_STATUS, SERVICE_TABLE_ENTRYW
from stockade.windows.wfpengine import WfpFirewall, windows_firewall

_log = logging.getLogger("stockade.fence")
STOP_WAIT = 10.0  # seconds the connections get to end when the service stops
RETRY_FIRST, RETRY_MOST = 0.1, 5.0  # seconds between tries to make a pipe instance


class Service:
    """The running service over `firewall` and the ledger in `state`."""

    def __init__(self, firewall: WfpFirewall, state: str) -> None:
        fence.register_kinds(firewall)
        self.firewall = firewall
        self.ledger = Ledger(state)
        self.fences = fence.Fences(firewall, self.ledger)
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._pipes: dict[int, threading.Thread] = {}
        self._users: Counter[str] = Counter()  # connections served, by the caller's user

    def reconcile(self) -> None:
        done = self.ledger.reconcile()
        if done.removed or done.failed or done.quarantined:
            _log.info("reconciled: %d removed, %d to retry, %d quarantined",
                      len(done.removed), done.failed, done.quarantined)

    def serve(self) -> None:
        """Accept callers until `stop`."""
        api = fence_win32()
        first, backoff = True, RETRY_FIRST
        while not self.stopping.is_set():
            try:
                pipe = fencepipe.server_pipe(first)
            except OSError as exc:  # (every instance taken, say: the service goes on)
                if first:
                    raise  # (another process has the name: nothing to serve)
                _log.warning("no pipe instance (%s); retrying", exc.strerror)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, RETRY_MOST)
                continue
            first, backoff = False, RETRY_FIRST
            connected = api.ConnectNamedPipe(pipe, None) or last_error() == ERROR_PIPE_CONNECTED
            if self.stopping.is_set() or not connected:
                win32().CloseHandle(pipe)
                continue
            thread = threading.Thread(target=self._connection, args=(pipe, now()),
                                      name="stockade-fence-connection", daemon=True)
            with self._lock:
                self._pipes[pipe] = thread
            thread.start()

    def _connection(self, pipe: int, accepted: int) -> None:
        transport = fencepipe.PipeTransport(pipe)
        watch = fence.FrameWatch(lambda: fence_win32().DisconnectNamedPipe(pipe),
                                 fence.FRAME_WAIT)
        user = None
        try:
            try:
                caller = fencepipe.process_facts(fencepipe.client_pid(pipe))
            except OSError:
                return  # (the caller is gone already: nothing to answer)
            with self._lock:
                if self._users[caller.user] >= fence.MAX_PER_USER:
                    busy = True
                else:
                    busy, user = False, caller.user
                    self._users[user] += 1
            if busy:  # (one user cannot take every instance of the pipe)
                with contextlib.suppress(OSError):
                    transport.write(fenceproto.encode(fenceproto.refused(
                        "fence_busy", f"this user has {fence.MAX_PER_USER} connections to "
                        "the fence service already")))
                return
            connection = fence.Connection(self.fences, caller, accepted,
                                          fencepipe.process_facts, identity.derive_sid)
            fence.serve(transport.read, transport.write, connection, watch)
        finally:
            watch.close()
            with self._lock:
                self._pipes.pop(pipe, None)
                if user is not None:
                    self._users[user] -= 1
                    if not self._users[user]:
                        del self._users[user]
            transport.close()

    def reconcile_every(self) -> None:
        while not self.stopping.wait(fence.RECONCILE_EVERY):
            try:
                self.reconcile()
            except Exception:  # (logged; the next round tries again)
                _log.exception("reconcile failed")

    def stop(self) -> None:
        """Disconnect every caller (each connection then takes its fence back), reconcile,
        and remove the sublayer if the fence left nothing in it."""
        self.stopping.set()
        with contextlib.suppress(OSError):  # wake the accept loop
            fencepipe.connect().close()
        with self._lock:
            live = dict(self._pipes)
        for pipe in live:
            with contextlib.suppress(OSError):
                fence_win32().DisconnectNamedPipe(pipe)
        for thread in live.values():
            thread.join(STOP_WAIT)
        self.reconcile()
        try:
            self.firewall.remove_sublayer()
        except OSError as exc:
            _log.info("the sublayer stays (%s): a fence's filters are kept", exc.strerror)


def run_service() -> None:
    """What the service control manager calls: report, serve, report."""
    handler_type = ctypes.WINFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                      ctypes.c_void_p, ctypes.c_void_p)
    main_type = ctypes.WINFUNCTYPE(None, ctypes.c_uint32, ctypes.c_void_p)
    api = fence_win32()
    held: dict = {}

    def report(state: int, code: int = 0) -> None:
        status = SERVICE_STATUS(SERVICE_WIN32_OWN_PROCESS, state,
                                0 if state != SERVICE_RUNNING
                                else SERVICE_ACCEPT_STOP | SERVICE_ACCEPT_SHUTDOWN, code, 0, 0,
                                30000 if state in (SERVICE_START_PENDING,
                                                   SERVICE_STOP_PENDING) else 0)
        api.SetServiceStatus(held["status"], ctypes.byref(status))

    def control(code: int, event: int, data: int, context: int) -> int:
        if code in (SERVICE_CONTROL_STOP, SERVICE_CONTROL_SHUTDOWN):
            report(SERVICE_STOP_PENDING)
            service = held.get("service")
            if service is not None:
                threading.Thread(target=service.stop, daemon=True).start()
            return 0
        return 0 if code == SERVICE_CONTROL_INTERROGATE else ERROR_CALL_NOT_IMPLEMENTED

    def main(argc: int, argv: int) -> None:
        held["status"] = api.RegisterServiceCtrlHandlerExW(
            fenceinstall.SERVICE_NAME, ctypes.cast(held["control"], ctypes.c_void_p), None)
        report(SERVICE_START_PENDING)
        try:
            why = fenceinstall.state_refusal(fenceinstall.STATE)
            if why:
                raise OSError(None, why)
            service = Service(windows_firewall(), fenceinstall.STATE)
            service.reconcile()
        except Exception:
            _log.exception("the fence service cannot start")
            report(SERVICE_STOPPED, 1)
            return
        held["service"] = service
        threading.Thread(target=service.reconcile_every, daemon=True).start()
        report(SERVICE_RUNNING)
        try:
            service.serve()
        except Exception:
            _log.exception("the fence service stopped serving")
            service.stop()
        report(SERVICE_STOPPED)

    held["control"] = handler_type(control)
    held["main"] = main_type(main)
    table = (SERVICE_TABLE_ENTRYW * 2)()
    table[0].lpServiceName = fenceinstall.SERVICE_NAME
    table[0].lpServiceProc = ctypes.cast(held["main"], ctypes.c_void_p)
    api.StartServiceCtrlDispatcherW(table)


if __name__ == "__main__":
    if os.path.isdir(fenceinstall.STATE):  # (made by the install; never here, see state_refusal)
        logging.basicConfig(filename=os.path.join(fenceinstall.STATE, "service.log"),
                            level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run_service()
    sys.exit(0)
