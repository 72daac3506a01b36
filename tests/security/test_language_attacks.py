"""The adversarial suite's relevant attacks written in Java, Go, Rust and TypeScript: host files,
the host's environment, the host's loopback listener, writes to the read-only runtime, and
thread bombs against the pids limit (the JVM starts many threads of its own)."""

from __future__ import annotations

import json

import pytest
from sec_helpers import HostWorld, PoolInfo, attack, limits, report

from sandloop import Status
from sandloop.sandbox.languages import LanguageUnavailable, spec_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Each probe gets: a host file path, an environment variable name, a host TCP port; and prints
# one JSON line of what it could do (1: the attack worked).
PROBES = {
    "java": """import java.io.*;
import java.net.*;
import java.nio.file.*;
public class Main { public static void main(String[] a) {
    int read = 0, env = 0, net = 0, write = 0;
    try { Files.readAllBytes(Paths.get(a[0])); read = 1; } catch (Exception e) {}
    if (System.getenv(a[1]) != null) env = 1;
    try (Socket s = new Socket()) { s.connect(new InetSocketAddress("127.0.0.1",
        Integer.parseInt(a[2])), 1000); net = 1; } catch (Exception e) {}
    try { Files.write(Paths.get("/usr/sandloop-pwn"), new byte[]{1}); write = 1; }
    catch (Exception e) {}
    System.out.println("{\\"read\\":" + read + ",\\"env\\":" + env + ",\\"net\\":" + net
        + ",\\"write\\":" + write + "}"); } }
""",
    "go": """package main
import ("fmt"; "net"; "os"; "time")
func main() {
    read, env, nt, write := 0, 0, 0, 0
    if _, err := os.ReadFile(os.Args[1]); err == nil { read = 1 }
    if _, ok := os.LookupEnv(os.Args[2]); ok { env = 1 }
    if c, err := net.DialTimeout("tcp", "127.0.0.1:"+os.Args[3], time.Second); err == nil { nt = 1; c.Close() }
    if err := os.WriteFile("/usr/sandloop-pwn", []byte{1}, 0644); err == nil { write = 1 }
    fmt.Printf("{\\"read\\":%d,\\"env\\":%d,\\"net\\":%d,\\"write\\":%d}\\n", read, env, nt, write)
}
""",
    "rust": """use std::net::TcpStream;
use std::time::Duration;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let read = std::fs::read(&a[1]).is_ok() as i32;
    let env = std::env::var_os(&a[2]).is_some() as i32;
    let addr = format!("127.0.0.1:{}", a[3]).parse().unwrap();
    let net = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() as i32;
    let write = std::fs::write("/usr/sandloop-pwn", b"1").is_ok() as i32;
    println!("{{\\"read\\":{},\\"env\\":{},\\"net\\":{},\\"write\\":{}}}", read, env, net, write);
}
""",
    "typescript": """import * as fs from "fs";
import * as net from "net";
const [path, name, port] = process.argv.slice(2);
const seen = { read: 0, env: 0, net: 0, write: 0 };
try { fs.readFileSync(path); seen.read = 1; } catch (e) { /* refused */ }
if (process.env[name] !== undefined) seen.env = 1;
try { fs.writeFileSync("/usr/sandloop-pwn", "1"); seen.write = 1; } catch (e) { /* refused */ }
const s = net.connect(Number(port), "127.0.0.1");
const done = () => { console.log(JSON.stringify(seen)); process.exit(0); };
s.on("connect", () => { seen.net = 1; s.destroy(); done(); });
s.on("error", done);
setTimeout(done, 1000);
""",
}

LANGS = tuple(PROBES)

# These tests are about the program, not its compile step (tests/sandbox/test_run.py holds the
# compile limits): the compile gets an explicit budget instead of the one derived from time_s
# (2 x time_s, at least 20 s). Measured in the cgroup v2 guest (User-mode Linux, one CPU, every
# syscall and page fault ~10x dearer), `go build` of the Go probe took 10-15 s of CPU, against
# 1.2 s on the host: it imports net, whose shipped archive was built with cgo, so under
# CGO_ENABLED=0 every compile rebuilds it. Against the derived 20 s of wall (and CPU) time,
# a guest on a busy host ran out (CI's guest failed this test on [go]).
COMPILE_S = 60.0


def _require(lang: str) -> None:
    try:
        spec_for(lang).check_available()
    except LanguageUnavailable as e:  # pragma: no cover - `make` installs the toolchains
        pytest.skip(str(e))


@pytest.mark.parametrize("lang", LANGS)
async def test_host_files_env_network_and_runtime_are_out_of_reach(
        sandbox: PoolInfo, host_world: HostWorld, lang: str) -> None:
    _require(lang)
    before = host_world.tcp.accepted
    r = await attack(sandbox.pool, PROBES[lang], lang,
                     lim=limits(time_s=10, memory_mb=256, max_processes=64,
                                compile_time_s=COMPILE_S),
                     argv=[str(host_world.sentinel), host_world.secret_env,
                           str(host_world.tcp.address[1])])
    assert r.status is Status.OK, (r.status, r.stderr[-800:], r.compile and r.compile.stderr)
    assert report(r) == {"read": 0, "env": 0, "net": 0, "write": 0}
    assert host_world.secret not in r.stdout + r.stderr
    assert host_world.tcp.accepted == before


THREAD_BOMBS = {
    "java": """public class Main { public static void main(String[] a) throws Exception {
    int n = 0; String err = null;
    try { while (true) { Thread t = new Thread(() -> { try { Thread.sleep(30000); }
        catch (InterruptedException e) {} }); t.setDaemon(true); t.start(); n++; } }
    catch (Throwable e) { err = e.getClass().getName(); }
    System.out.println("{\\"threads\\":" + n + ",\\"err\\":\\"" + err + "\\"}");
    System.exit(0); } }
""",
    "rust": """fn main() {
    let mut n = 0; let mut err = String::new();
    loop {
        match std::thread::Builder::new().spawn(|| std::thread::sleep(std::time::Duration::from_secs(30))) {
            Ok(_) => n += 1,
            Err(e) => { err = format!("{:?}", e.kind()); break; }
        }
    }
    println!("{{\\"threads\\":{},\\"err\\":\\"{}\\"}}", n, err);
    std::process::exit(0);
}
""",
}


@pytest.mark.parametrize("lang", tuple(THREAD_BOMBS))
async def test_thread_bomb_is_held_by_the_pids_limit(sandbox: PoolInfo, lang: str) -> None:
    _require(lang)
    r = await attack(sandbox.pool, THREAD_BOMBS[lang], lang,
                     lim=limits(time_s=10, memory_mb=256, max_processes=32,
                                compile_time_s=COMPILE_S))
    assert r.status is Status.OK, (r.status, r.stderr[-800:], r.compile and r.compile.stderr)
    seen = report(r)
    assert seen["err"] not in (None, "null", "")
    assert int(str(seen["threads"])) < 32  # the runtime's own threads count too


async def test_go_thread_bomb_ends_as_a_failed_run(sandbox: PoolInfo) -> None:
    # Go's runtime cannot report a refused thread to the program: it aborts the run.
    _require("go")
    src = """package main
import ("runtime"; "time")
func main() {
    for i := 0; i < 1000; i++ { go func() { runtime.LockOSThread(); time.Sleep(30 * time.Second) }() }
    time.Sleep(30 * time.Second)
}
"""
    r = await attack(sandbox.pool, src, "go", lim=limits(time_s=5, memory_mb=256,
                                                         max_processes=32,
                                                         compile_time_s=COMPILE_S))
    assert r.status is Status.RUNTIME_ERROR, (r.status, r.stderr[-500:])
    assert "thread" in r.stderr.lower(), json.dumps(r.stderr[-500:])
