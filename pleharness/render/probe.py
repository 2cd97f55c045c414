"""Rich rendering of a probe result (:func:`pleharness.probe.run_probe` or
:func:`pleharness.probe.capability_summary` output, live or loaded from JSON)."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

STATUS_STYLE = {"ok": "bold green", "fallback": "bold yellow", "failed": "bold red", "unavailable": "bold magenta",
                "skipped": "dim"}


def fmt_bytes(n: int | None) -> str:
    """256 -> '256 B', 1024 -> '1 KiB', 65536 -> '64 KiB', 268435456 -> '256 MiB'."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def fmt_us(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _yn(v: Any) -> str:
    return "n/a" if v is None else ("yes" if v else "no")


def _status(s: str | None) -> str:
    s = s or "-"
    return f"[{STATUS_STYLE.get(s, '')}]{s}[/]" if s in STATUS_STYLE else s


def _summary_table(r: dict) -> Table:
    t = Table(title="PLE deferred-row probe", box=box.SIMPLE_HEAVY, show_header=False, title_justify="left")
    t.add_column("item", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    status = _status(r.get("status"))
    if r.get("reason"):
        status += f"  {r['reason']}"
    t.add_row("status", status)
    dev = r.get("device") or "-"
    d = r.get("device_detail") or {}
    if d:
        dev += f"  (cuda:{d.get('index')}, cc {d.get('compute_capability')}, {d.get('pci_bus_id')}, " \
               f"{fmt_bytes(d.get('total_memory_bytes'))})"
    t.add_row("device", dev)
    cv = r.get("cuda_version") or {}
    t.add_row("driver", f"{r.get('driver_version') or '-'}  (CUDA driver API {cv.get('driver_api') or '-'})")
    t.add_row("CUDA", f"runtime {cv.get('runtime') or '-'} · torch {cv.get('torch') or '-'} · "
                      f"toolkit {cv.get('toolkit') or '-'}")
    m = r.get("memops")
    if m:
        t.add_row("stream memops",
                  f"wait32 {_yn(m.get('wait_value_32'))} · write32 {_yn(m.get('write_value_32'))} · "
                  f"wait64 {_yn(m.get('wait_value_64'))} · write64 {_yn(m.get('write_value_64'))} · "
                  f"NOR {_yn(m.get('wait_value_nor'))} · mapped host memory {_yn(m.get('can_map_host_memory'))}"
                  + (f"  (API {m['api']})" if m.get("api") else ""))
    else:
        t.add_row("stream memops", "not probed")
    g = r.get("graph_capture")
    gd = r.get("graph_capture_detail") or {}
    if g is None:
        gtxt = "not tried"
    elif g:
        gtxt = "yes"
        if gd.get("node_types"):
            gtxt += f"  ({' -> '.join(gd['node_types'])}; replay {'verified' if gd.get('replay_ok') else 'FAILED'})"
    else:
        gtxt = f"no  ({gd.get('error') or 'capture failed'})"
    t.add_row("graph capture", gtxt)
    fb = r.get("fallback")
    t.add_row("fallback", fb if fb else ("none (deferred path usable)" if r.get("status") == "ok" else "-"))
    st = r.get("selftest")
    if isinstance(st, dict):
        txt = _status(st.get("status"))
        if st.get("status") == "skipped":
            txt += f"  ({st.get('reason') or 'not run'})"
        else:
            txt += f"  {st.get('replays', 0)} replays, {st.get('mismatches', 0)} mismatches"
            parts = []
            for run in st.get("runs") or []:
                parts.append(f"{fmt_bytes(run.get('row_bytes'))}: median {fmt_us(run.get('latency_us_median'))} us, "
                             f"p99 {fmt_us(run.get('latency_us_p99'))} us")
            if parts:
                txt += "  (" + "; ".join(parts) + ")"
            if st.get("reason"):
                txt += f"\n{st['reason']}"
        t.add_row("self-test", txt)
        sg = st.get("stranding_guard")
        if isinstance(sg, dict):
            t.add_row("stranding guard",
                      f"{_status(sg.get('status'))}  unsignalled WAIT blocked {fmt_us((sg.get('blocked_us') or 0) / 1e3)} ms, "
                      f"guard fired {_yn(sg.get('fired'))}, released {_yn(sg.get('released'))} "
                      f"in {fmt_us(sg.get('release_us'))} us, device usable {_yn(sg.get('device_usable'))}"
                      + (f"\n{sg['reason']}" if sg.get("reason") else ""))
    t.add_row("date / host", f"{r.get('date') or '-'}  {r.get('host') or ''}")
    return t


def _timings_table(tm: dict) -> Table:
    bw = tm.get("h2d_bandwidth_gb_per_s")
    bwd = tm.get("h2d_bandwidth") or {}
    cap = "per-replay host wall-clock; deferred = graph launch + host gather + flag + drain; " \
          "sync = host gather + cudaMemcpy + drain"
    if bw:
        cap += f"\nH2D bandwidth {bw:.1f} GB/s ({fmt_bytes(bwd.get('bytes'))} pinned copy, median of " \
               f"{bwd.get('reps')}); floor = row bytes / bandwidth"
    t = Table(title=f"Timings (us, {tm.get('iters')} samples per size)", caption=cap, box=box.SIMPLE_HEAVY,
              title_justify="left", caption_justify="left")
    for col in ("row", "deferred\nmedian", "deferred\np99", "sync\nmedian", "sync\np99", "def-sync\nmedian",
                "signal->\ndone med", "floor\n(us)"):
        t.add_column(col, justify="right", no_wrap=True)
    for row in tm.get("rows") or []:
        delta = row.get("deferred_minus_sync_us_median")
        t.add_row(fmt_bytes(row.get("row_bytes")), fmt_us(row.get("deferred_us_median")),
                  fmt_us(row.get("deferred_us_p99")), fmt_us(row.get("sync_us_median")),
                  fmt_us(row.get("sync_us_p99")), ("-" if delta is None else f"{delta:+.1f}"),
                  fmt_us(row.get("deferred_signal_to_done_us_median")),
                  fmt_us(row.get("bandwidth_floor_us"), 2))
    return t


def render(result: dict, console: Console) -> None:
    """Print ``result`` (a :func:`run_probe` / :func:`capability_summary` dict, or one loaded from
    its JSON) to ``console``: a summary table (status and reason, device, driver and CUDA
    versions, memops support, graph capture, fallback, self-test, stranding guard) and, when
    present, the timings table (deferred vs synchronous median/p99 in microseconds per row size,
    the bandwidth floor, and the H2D bandwidth in GB/s). Missing sections print as '-' or are
    left out; never raises for a well-formed (JSON-object) result."""
    console.print(_summary_table(result))
    tm = result.get("timings")
    if isinstance(tm, dict) and tm.get("rows"):
        console.print(_timings_table(tm))
