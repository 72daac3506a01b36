/*
 * The child's isolation steps and the zygote's steady-state loop in C: the fast path of
 * the zygote package (zygote/child.py and zygote/server.py hold the same steps and loop in
 * Python, used when sandloop was installed without a C compiler); protocol.py describes the
 * protocol.
 *
 * Why C: a child is a fork of the warm zygote interpreter, and every Python object it touches
 * costs a copy-on-write page fault. Done in Python, these steps touched ~600 pages per run
 * (~2 ms of CPU here); done here they touch a few. The steps, their order and their error
 * reports are those of zygote.child.prepare_child, drop_privileges and write_files.
 *
 * Loaded with ctypes by the zygote (never by the supervisor), compiled when sandloop is
 * installed (setup.py; jailbuild.py finds it). No Python headers: any CPython can load it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* The protocol shared with Python: each value must equal sandbox/protocol.py's of the same name
 * (tests/sandbox/test_protocol.py parses these lines and compares them). */
#define SETUP_FAILED_EXIT 125
#define WORK_DIR "/sandbox"
#define N_RUN_FDS 7
#define SPEC_MAGIC "SLS1"
#define CHILD_RUN "run"     /* zygote -> child: the request, + the session work dir */
#define CTL_READY 'R'       /* child -> zygote: isolated, waiting */
#define CTL_FAILED 'E'      /* child -> zygote: setup failed, + why */
#define REC_STARTED 'S'     /* status records (protocol.Record) */
#define REC_SETUP_FAILED 'E'
#define REC_FILES_FAILED 'W'
#define REC_EXIT 'X'
#define FD_FILES 1          /* a run's descriptors (protocol.RunFd) */
#define FD_SPEC 2
#define FD_STATUS 6

/* The SHA-256 of this file, given by setup.py when it builds the library at install time:
 * jailbuild.py refuses a library built from another version of this file. */
#ifndef SL_SOURCE_SHA256
#define SL_SOURCE_SHA256 ""
#endif
const char *sl_source_sha256(void) { return SL_SOURCE_SHA256; }

/* Everything a child needs, prepared by the zygote before the clone (see zygote.cjail.Jail). */
struct sl_child {
    int ctl_fd;              /* the child's end of the request socket */
    int parent_fd;           /* the zygote's end: closed in the child */
    const char *work_opts;   /* tmpfs options for a fresh /sandbox */
    const char *tmp_opts;    /* tmpfs options for /tmp */
    const char **tmp_binds;  /* kept copy, path under /tmp, ... (runtimes that live in /tmp) */
    int n_tmp_binds;
    const char *private_dir; /* the zygote's private area, detached in the child */
    unsigned int uid, gid;
    const unsigned char *bpf; /* classic BPF seccomp program, 8-byte instructions */
    unsigned int bpf_len;
    int detach_early;        /* no session dir to bind: private_dir goes before the request */
    int net_fd;              /* the slot's network namespace to join, or -1: cloned into a fresh one */
    int zygote_net_fd;       /* the zygote's own network namespace (closed in the child), or -1 */
};

/* Report a setup failure (before any untrusted code runs) and exit: on the control socket
 * before the request (the zygote reads it), on the status pipe after it (the supervisor).
 * kind REC_SETUP_FAILED: the sandbox failed; REC_FILES_FAILED: the run's files could not be
 * written (see file_errno). */
static void vfail(char kind, int ctl_fd, int status_fd, const char *fmt, va_list ap)
{
    char buf[5 + 1024];
    int n = vsnprintf(buf + 5, 1024, fmt, ap);
    if (n < 0)
        n = 0;
    if (n > 1023)
        n = 1023;
    if (status_fd >= 0) {
        /* a status record: kind, u32 little-endian length, the message */
        buf[0] = kind;
        buf[1] = (char)(n & 0xff);
        buf[2] = (char)((n >> 8) & 0xff);
        buf[3] = 0;
        buf[4] = 0;
        ssize_t w = write(status_fd, buf, (size_t)n + 5);
        (void)w;
    } else if (ctl_fd >= 0) {
        buf[4] = CTL_FAILED;
        ssize_t w = send(ctl_fd, buf + 4, (size_t)n + 1, 0);
        (void)w;
    }
    _exit(SETUP_FAILED_EXIT);
}

static void fail(int ctl_fd, int status_fd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(REC_SETUP_FAILED, ctl_fd, status_fd, fmt, ap);
    va_end(ap);
}

/* Why writing the run's files fails when the request or an earlier program of the session is
 * to blame (too big for the work dir or its memory; a path the program made unusable): a
 * program verdict, never an infrastructure failure. Must match protocol.FILE_ERRNO_NAMES. */
static int file_errno(int e)
{
    switch (e) {
    case ENOSPC: case EFBIG: case EDQUOT: case ENOMEM: case ENOTDIR: case EISDIR: case EEXIST:
    case EACCES: case EPERM: case ELOOP: case EROFS: case ENAMETOOLONG: case EMLINK:
    case ETXTBSY:
        return 1;
    default:
        return 0;
    }
}

static void fail_files(int status_fd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(REC_FILES_FAILED, -1, status_fd, fmt, ap);
    va_end(ap);
}

/* Writing the request's file `name` failed (errno): the program's verdict or the sandbox's. */
#define FILE_FAIL(what, name)                                                                 \
    do {                                                                                      \
        int e_ = errno;                                                                       \
        if (file_errno(e_))                                                                   \
            fail_files(st, "cannot %s %s: %s", what, name, strerror(e_));                     \
        fail(ctl, st, "OSError: cannot %s %s: %s", what, name, strerror(e_));                 \
    } while (0)

#define CHECK(expr, ...) do { if ((expr) < 0) fail(ctl, st, __VA_ARGS__); } while (0)

static int mkdirs(const char *path, mode_t mode)
{
    char buf[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf)
        return errno = ENAMETOOLONG, -1;
    memcpy(buf, path, len + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, mode) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(buf, mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One message with up to 16 descriptors: SCM_RIGHTS on a unix socket. */
static ssize_t send_fds(int sock, const void *buf, size_t len, const int *fds, int n_fds)
{
    union {
        char space[CMSG_SPACE(sizeof(int) * 16)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {(void *)buf, len};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n_fds > 0) {
        msg.msg_control = u.space;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n_fds);
    }
    ssize_t n;
    while ((n = sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    return n;
}

/* Receive one message and its descriptors (close-on-exec; up to max kept in fds, any more
 * closed; *n_fds counts them all). Retries on EINTR. */
static ssize_t recv_fds(int sock, void *buf, size_t size, int *fds, int max, int *n_fds)
{
    union {
        char space[CMSG_SPACE(sizeof(int) * 16)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {buf, size};
    struct msghdr msg;
    ssize_t n;
    do {
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = u.space;
        msg.msg_controllen = sizeof u.space;
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    *n_fds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); n >= 0 && cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                if (*n_fds < max)
                    fds[*n_fds] = fd;
                else
                    close(fd);
                (*n_fds)++;
            }
        }
    }
    return n;
}

/* Map a sealed memfd read-only; *len receives its size. NULL (len 0) for an empty file. */
static const unsigned char *map_fd(int fd, size_t *len)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return NULL;
    *len = (size_t)sb.st_size;
    if (*len == 0)
        return NULL;
    void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Create the request's files (see safefs.pack_files): as the slot user, inside the jail. */
static void write_files(int files_fd, int ctl, int st)
{
    size_t len = 0;
    const unsigned char *data = map_fd(files_fd, &len);
    if (data == NULL && len != 0)
        fail(ctl, st, "OSError: cannot map the request's files: %s", strerror(errno));
    size_t pos = 0;
    char name[4097];
    while (pos < len) {
        if (len - pos < 14)
            fail(ctl, st, "SetupError: truncated file table");
        uint32_t nlen;
        uint64_t dlen;
        uint16_t mode;
        memcpy(&nlen, data + pos, 4);
        memcpy(&dlen, data + pos + 4, 8);
        memcpy(&mode, data + pos + 12, 2);
        pos += 14;
        if (nlen == 0 || nlen >= sizeof name || nlen > len - pos || dlen > len - pos - nlen)
            fail(ctl, st, "SetupError: bad file table entry");
        memcpy(name, data + pos, nlen);
        name[nlen] = 0;
        pos += nlen;
        if (strlen(name) != nlen)
            fail(ctl, st, "SetupError: file name with a NUL byte");
        if (name[0] == '/' && strncmp(name, "/tmp/", 5) != 0)
            fail(ctl, st, "SetupError: refusing to write '%s' outside /sandbox and /tmp", name);
        char *slash = strrchr(name, '/');
        if (slash != NULL && slash != name) {
            *slash = 0;
            if (mkdirs(name, 0777) < 0)
                FILE_FAIL("create directory", name);
            *slash = '/';
        }
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd < 0)
            FILE_FAIL("write", name);
        if (write_all(fd, data + pos, (size_t)dlen) < 0 || fchmod(fd, mode) < 0)
            FILE_FAIL("write", name);
        close(fd);
        pos += (size_t)dlen;
    }
    if (data != NULL)
        munmap((void *)data, len);
}

/* The spec memfd starts with "SLS1", a u32 count and that many (i32 resource, u64 limit). */
static void set_rlimits(int spec_fd, int ctl, int st)
{
    unsigned char head[8];
    if (pread(spec_fd, head, 8, 0) != 8 || memcmp(head, SPEC_MAGIC, 4) != 0)
        fail(ctl, st, "SetupError: bad run spec");
    uint32_t n;
    memcpy(&n, head + 4, 4);
    if (n > 64)
        fail(ctl, st, "SetupError: bad run spec");
    for (uint32_t i = 0; i < n; i++) {
        unsigned char item[12];
        if (pread(spec_fd, item, 12, 8 + 12 * (off_t)i) != 12)
            fail(ctl, st, "SetupError: bad run spec");
        int32_t res;
        uint64_t val;
        memcpy(&res, item, 4);
        memcpy(&val, item + 4, 8);
        struct rlimit rl = {(rlim_t)val, (rlim_t)val};
        CHECK(setrlimit(res, &rl), "OSError: setrlimit(%d): %s", res, strerror(errno));
    }
}

/* Bring up lo in the current network namespace. 0, or -1 with errno and *what set. */
static int lo_up(const char **what)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return *what = "socket", -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    *what = "SIOCGIFFLAGS lo";
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
        *what = "SIOCSIFFLAGS lo";
    }
    int e = errno;
    close(s);
    errno = e;
    return r;
}

static void loopback_up(int ctl, int st)
{
    const char *what = "";
    CHECK(lo_up(&what), "SetupError: %s: %s", what, strerror(errno));
}

/* The network namespace, for the child: the slot's (see shared_net), or the fresh one it was
 * cloned into, whose loopback it brings up. */
static void enter_net(const struct sl_child *c, int ctl, int st)
{
    if (c->net_fd < 0) {
        loopback_up(ctl, st);
    } else {
        CHECK(setns(c->net_fd, CLONE_NEWNET), "SetupError: setns(net): %s", strerror(errno));
        close(c->net_fd);
    }
    if (c->zygote_net_fd >= 0)
        close(c->zygote_net_fd);
}

/* Steps 2-3 of the zygote package's list: the child isolates itself before it knows what it runs. */
static void prepare(const struct sl_child *c)
{
    int ctl = c->ctl_fd, st = -1;
    CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "SetupError: prctl(PDEATHSIG): %s", strerror(errno));
    close(c->parent_fd);
    CHECK(mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, c->tmp_opts),
          "SetupError: mount /tmp: %s", strerror(errno));
    for (int i = 0; i < c->n_tmp_binds; i++) {
        const char *kept = c->tmp_binds[2 * i], *path = c->tmp_binds[2 * i + 1];
        CHECK(mkdirs(path, 0755), "SetupError: mkdir %s: %s", path, strerror(errno));
        CHECK(mount(kept, path, NULL, MS_BIND | MS_REC, NULL), "SetupError: mount %s: %s", path,
              strerror(errno));
        CHECK(mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL),
              "SetupError: mount %s: %s", path, strerror(errno));
    }
    CHECK(mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
          "SetupError: mount /proc: %s", strerror(errno));
    /* When the slot's memory runs out, the OOM killer must pick the run, never the zygote. */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    CHECK(fd, "SetupError: oom_score_adj: %s", strerror(errno));
    CHECK(write(fd, "1000", 4), "SetupError: oom_score_adj: %s", strerror(errno));
    close(fd);
    /* Then /proc turns read-only: an exec'd program is dumpable again and owns its /proc files,
     * and without CAP_SYS_RESOURCE when the 1000 was written (container hosts lack it) nothing
     * pins it there: the program could write 0 back and let the host's OOM killer pick a host
     * process instead. A read-only mount refuses every write under /proc (EROFS). */
    CHECK(mount(NULL, "/proc", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                NULL), "SetupError: remount /proc read-only: %s", strerror(errno));
    CHECK(sethostname("sandbox", 7), "SetupError: sethostname: %s", strerror(errno));
    enter_net(c, ctl, st);
    /* Cloned while the zygote held no session dir, this child can only serve a run without
     * one: detach the private area now. The unmount waits for an RCU grace period (~0.4 ms on
     * average here, over 1 ms at times), which then delays no run. */
    if (c->detach_early)
        CHECK(umount2(c->private_dir, MNT_DETACH), "SetupError: umount %s: %s", c->private_dir,
              strerror(errno));
    /* The capability bounding set is already empty (inherited from the zygote). */
}

/* Wait for the one request: "run" + the session work dir to bind at /sandbox (or nothing),
 * with N_RUN_FDS file descriptors (see zygote.child.serve_one). The path is copied into work (NUL-ended). */
static void receive(const struct sl_child *c, int *fds, char *work, size_t work_size)
{
    char buf[4096];
    int got;
    ssize_t n = recv_fds(c->ctl_fd, buf, sizeof buf, fds, N_RUN_FDS, &got);
    const size_t k = sizeof CHILD_RUN - 1;
    if (n < (ssize_t)k || got != N_RUN_FDS || memcmp(buf, CHILD_RUN, k) != 0 || (size_t)n - k >= work_size)
        _exit(SETUP_FAILED_EXIT);
    memcpy(work, buf + k, (size_t)n - k);
    work[(size_t)n - k] = 0;
    close(c->ctl_fd);
}

/* /sandbox: a session's work dir, or a fresh tmpfs that no earlier run touched; then the
 * zygote's private area (other sessions' work dirs, the host's /proc) goes away. */
static void enter_work_dir(const struct sl_child *c, const char *work, int st)
{
    int ctl = -1;
    /* The zygote moved this child into the run's own cgroups before the request: make them the
     * root of a cgroup namespace, so that the run sees "/" and not the host's group names. */
    CHECK(unshare(CLONE_NEWCGROUP), "SetupError: unshare(CLONE_NEWCGROUP): %s", strerror(errno));
    if (work[0] != 0) {
        /* Only a session dir mounted under <private>/work/: a bare directory there would be
         * the zygote's own tmpfs (the dir was mounted after this child was cloned). */
        if (c->detach_early)
            fail(ctl, st, "SetupError: work dir %s is not mounted in this child", work);
        size_t plen = strlen(c->private_dir);
        struct stat ws, bs;
        char base[4096];
        if (strncmp(work, c->private_dir, plen) != 0 || strncmp(work + plen, "/work/", 6) != 0 ||
            strchr(work + plen + 6, '/') != NULL || work[plen + 6] == 0 || plen + 6 >= sizeof base)
            fail(ctl, st, "SetupError: bad work dir '%s'", work);
        memcpy(base, work, plen + 5);
        base[plen + 5] = 0;
        if (stat(work, &ws) < 0 || stat(base, &bs) < 0 || ws.st_dev == bs.st_dev)
            fail(ctl, st, "SetupError: work dir %s is not mounted in this child", work);
        CHECK(mount(work, WORK_DIR, NULL, MS_BIND, NULL), "SetupError: mount %s: %s", WORK_DIR,
              strerror(errno));
    } else {
        CHECK(mount("tmpfs", WORK_DIR, "tmpfs", MS_NOSUID | MS_NODEV, c->work_opts),
              "SetupError: mount %s: %s", WORK_DIR, strerror(errno));
    }
    if (!c->detach_early)
        CHECK(umount2(c->private_dir, MNT_DETACH), "SetupError: umount %s: %s", c->private_dir,
              strerror(errno));
}

/* Step 4: rlimits, the slot's uid/gid for good, no_new_privs, seccomp, then the files. */
static void lock_down(const struct sl_child *c, const int *fds)
{
    int ctl = -1, st = fds[FD_STATUS];
    set_rlimits(fds[FD_SPEC], ctl, st);
    CHECK(setgroups(0, NULL), "OSError: setgroups: %s", strerror(errno));
    CHECK(setresgid(c->gid, c->gid, c->gid), "OSError: setresgid: %s", strerror(errno));
    CHECK(setresuid(c->uid, c->uid, c->uid), "OSError: setresuid: %s", strerror(errno));
    if (getuid() != c->uid || geteuid() != c->uid || getegid() != c->gid)
        fail(ctl, st, "SetupError: uid/gid drop did not take effect");
    /* Credential changes clear the parent-death signal: set it again. */
    CHECK(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "SetupError: prctl(PDEATHSIG): %s", strerror(errno));
    CHECK(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "SetupError: prctl(DUMPABLE): %s", strerror(errno));
    /* The slot user owns /sandbox: give it back its rwx if a session's earlier program took
     * them away (chmod 000 .), or this run could not enter it and a program could make every
     * later run of its session an infrastructure failure (see zygote.child._own_work_dir). */
    struct stat wd;
    CHECK(stat(WORK_DIR, &wd), "OSError: stat %s: %s", WORK_DIR, strerror(errno));
    if ((wd.st_mode & 0700) != 0700)
        CHECK(chmod(WORK_DIR, (wd.st_mode & 07777) | 0700), "OSError: chmod %s: %s", WORK_DIR,
              strerror(errno));
    CHECK(chdir(WORK_DIR), "OSError: chdir %s: %s", WORK_DIR, strerror(errno));
    CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "SetupError: prctl(NO_NEW_PRIVS): %s", strerror(errno));
    if (c->bpf_len > 0) {
        struct sock_fprog prog = {(unsigned short)(c->bpf_len / 8), (struct sock_filter *)c->bpf};
        if (c->bpf_len % 8 != 0)
            fail(ctl, st, "SetupError: seccomp program has a bad length");
        CHECK(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0), "SetupError: seccomp: %s",
              strerror(errno));
    }
    write_files(fds[FD_FILES], ctl, st);
    close(fds[FD_FILES]);
}

/*
 * clone() into new namespaces (flags) with fork semantics. In the zygote: returns the child's
 * pid, or -errno. In the child: isolates itself, reports ready ("R" on ctl_fd), waits for its
 * request, mounts its work dir, locks itself down and returns 0 with the request's 7 descriptors in fds (the files
 * memfd already consumed and closed, slot -1). A failing child reports why and exits; it never
 * returns. The caller brackets this with PyOS_BeforeFork / PyOS_AfterFork_* (GIL held).
 */
long sl_spawn(unsigned long flags, const struct sl_child *c, int *fds)
{
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid != 0)
        return pid < 0 ? -errno : pid;
    char work[4096];
    prepare(c);
    const char ready_byte = CTL_READY;
    if (send(c->ctl_fd, &ready_byte, 1, 0) != 1)
        _exit(SETUP_FAILED_EXIT);
    receive(c, fds, work, sizeof work);
    /* "S": the request arrived. A child killed while it waited (the OOM killer prefers it)
     * then reads as an infrastructure failure, never as the run's own death by SIGKILL. */
    const char started[5] = {REC_STARTED, 0, 0, 0, 0};
    if (write(fds[FD_STATUS], started, 5) != 5)
        _exit(SETUP_FAILED_EXIT);
    enter_work_dir(c, work, fds[FD_STATUS]);
    lock_down(c, fds);
    fds[FD_FILES] = -1;
    return 0;
}

/*
 * The zygote's steady state: wait for requests and children's exits, serve a run with the
 * prepared child, reap, prepare the next child. zygote.server.Zygote.serve holds the same loop in
 * Python (used without a C compiler) and handles everything this one hands back: other
 * operations, session runs, a run whose prepared child is missing, died or has other tmpfs
 * sizes. Why C: between two clones the Python loop touched ~200 pages that its children
 * shared, one copy-on-write fault each (~1.4 ms of CPU per run with its own interpreting).
 *
 * State moves between the two loops whole (zygote.server.Zygote._to_c / _from_c): whichever loop
 * runs owns every descriptor in it.
 */
#define SL_MAX_RUNNING 16
#define SL_MAX_FDS 16
#define RUN_MAGIC "RUN1"
#define RUN_HEAD 24 /* magic, i64 work dir MiB, i64 work dir inodes, i32 cgroup files */
#define SL_NET_SNAP 32768 /* room for a network namespace's observable state (see net_snapshot) */
#define SL_NET_FILES 8    /* the files of NET_FILES */

struct sl_zygote {
    int sock;                  /* the supervisor's end */
    int spare_pid;             /* the prepared child; 0: none */
    int spare_ctl, spare_pidfd, spare_mntns, spare_ready;
    int n_running;
    int run_pid[SL_MAX_RUNNING], run_status[SL_MAX_RUNNING], run_pidfd[SL_MAX_RUNNING];
    unsigned long clone_flags;
    const struct sl_child *child; /* how to prepare a child for key; NULL: no run yet */
    const char *proc_dir;         /* the zygote's host-pid /proc */
    void *before_fork, *after_fork_parent, *after_fork_child; /* PyOS_* of the interpreter */
    char key[128];       /* the tmpfs options of the last run (and of the next prepared child) */
    char spare_key[128];
    int child_fds[N_RUN_FDS]; /* in a new child: its run's descriptors (see sl_spawn) */
    unsigned long fast_runs;  /* runs served here */
    int zygote_net;           /* the zygote's own network namespace; -1: runs never share one */
    int run_net;              /* the slot's run network namespace, or -1: none yet */
    int net_files[SL_NET_FILES]; /* its NET_FILES, open (-1: absent) */
    int net_snap_len;         /* its observable state when the last child joined it */
    char net_snap[SL_NET_SNAP];
    int n_fds;                /* out: a message for the Python loop, with its descriptors */
    int fds[SL_MAX_FDS];
    int msg_len;
    char msg[1 << 16];
};

static void call(void *fn) { ((void (*)(void))fn)(); }

static void close_spare(struct sl_zygote *z)
{
    close(z->spare_ctl);
    close(z->spare_pidfd);
    if (z->spare_mntns >= 0)
        close(z->spare_mntns);
    z->spare_pid = 0;
    z->spare_ctl = z->spare_pidfd = z->spare_mntns = -1;
}

static void discard_spare(struct sl_zygote *z)
{
    kill(z->spare_pid, SIGKILL);
    while (waitpid(z->spare_pid, NULL, 0) < 0 && errno == EINTR)
        ;
    close_spare(z);
}

/*
 * A slot's runs take turns in one network namespace instead of each making its own: creating
 * and freeing a namespace cost ~0.8 ms of CPU per run here (setup_net, then cleanup_net in a
 * kernel worker). Threat: a run that leaves state in it for the next run (a socket kept alive
 * by the kernel after its processes died, a port in TIME_WAIT, traffic counters carrying
 * bits). A child joins the slot's namespace only when no other run of the slot is alive (the
 * zygote prepares it with none running) and when everything a run can observe of the
 * namespace is exactly as it was when the previous child joined it: the sockets in use per
 * protocol (/proc/net/protocols), the traffic counters of lo and of every protocol (dev, snmp,
 * snmp6, netstat), and what outlives a socket without any traffic: IPv6 flow labels (they
 * linger after their socket closed) and IPv6 routes cached by a connect (ipv6_route's use
 * counts, rt6_stats). Any difference, even a socket the kernel has yet to free: the namespace
 * is dropped and a fresh one made. zygote.server.Zygote.shared_net is the same in Python.
 */
static const char *const NET_FILES[SL_NET_FILES] = {"protocols", "dev", "snmp", "snmp6", "netstat",
                                                   "ip6_flowlabel", "ipv6_route", "rt6_stats"};

/* The observable state of the slot's network namespace: the files above (opened in it: they
 * keep showing it), of /proc/net/protocols only the columns that belong to the namespace
 * (name, size, sockets: its "memory" column is the host's). Kept in z->net_snap (keep: its
 * length, or -1), or compared with it (1: the same, 0: not, or unreadable). Read a page at a
 * time into the stack: every page the zygote writes after a fork costs it a page fault. */
static int net_snapshot(struct sl_zygote *z, int keep)
{
    char buf[4096];
    int len = 0;
    for (int i = 0; i < SL_NET_FILES; i++) {
        int fd = z->net_files[i];
        if (fd < 0)
            continue; /* a kernel without it (snmp6 without IPv6): absent both times */
        int col = 0, in_word = 0;
        ssize_t n = lseek(fd, 0, SEEK_SET); /* a seq file: generated again from the start */
        while (n >= 0 && (n = read(fd, buf, sizeof buf)) > 0) {
            int m = (int)n;
            if (i == 0) { /* protocols: keep 3 columns of each line */
                int out = 0;
                for (int k = 0; k < (int)n; k++) {
                    char ch = buf[k];
                    if (ch == '\n') {
                        buf[out++] = ch;
                        col = in_word = 0;
                    } else if (ch == ' ') {
                        in_word = 0;
                    } else {
                        if (!in_word && ++col <= 3 && col > 1)
                            buf[out++] = ' ';
                        in_word = 1;
                        if (col <= 3)
                            buf[out++] = ch;
                    }
                }
                m = out;
            }
            if (len + m > (int)sizeof z->net_snap) {
                n = -1;
                break;
            }
            if (keep)
                memcpy(z->net_snap + len, buf, (size_t)m);
            else if (len + m > z->net_snap_len || memcmp(z->net_snap + len, buf, (size_t)m) != 0)
                n = -1;
            len += m;
            if (n < 0)
                break;
        }
        /* Each file ends with a NUL (never in them): no two states read the same. */
        if (n < 0 || len >= (int)sizeof z->net_snap || (!keep && (len >= z->net_snap_len || z->net_snap[len] != 0)))
            return keep ? -1 : 0;
        if (keep)
            z->net_snap[len] = 0;
        len++;
    }
    return keep ? len : len == z->net_snap_len;
}

/* Back to the zygote's own namespace; a zygote that cannot return leaves (its slot restarts). */
static void net_home(const struct sl_zygote *z)
{
    if (setns(z->zygote_net, CLONE_NEWNET) < 0)
        _exit(SETUP_FAILED_EXIT);
}

/* The namespace the next child joins (see above), or -1: it is cloned into a fresh one. */
static void drop_net(struct sl_zygote *z)
{
    if (z->run_net >= 0)
        close(z->run_net);
    z->run_net = -1;
    for (int i = 0; i < SL_NET_FILES; i++) {
        if (z->net_files[i] >= 0)
            close(z->net_files[i]);
        z->net_files[i] = -1;
    }
}

static int shared_net(struct sl_zygote *z)
{
    if (z->zygote_net < 0)
        return -1;
    if (z->run_net >= 0) {
        if (net_snapshot(z, 0))
            return z->run_net;
        drop_net(z);
    }
    /* A fresh one, made from the zygote's own: it gets the small TCP hash (see server.py). */
    const char *what;
    if (unshare(CLONE_NEWNET) < 0)
        return -1;
    char path[256];
    snprintf(path, sizeof path, "%s/self/ns/net", z->proc_dir);
    int n = -1;
    if (lo_up(&what) == 0 && (z->run_net = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
        for (int i = 0; i < SL_NET_FILES; i++) {
            snprintf(path, sizeof path, "%s/self/net/%s", z->proc_dir, NET_FILES[i]);
            z->net_files[i] = open(path, O_RDONLY | O_CLOEXEC);
        }
        n = net_snapshot(z, 1);
    }
    net_home(z);
    if (n < 0) {
        drop_net(z);
        return -1;
    }
    z->net_snap_len = n;
    return z->run_net;
}

/* Prepare the next run's child. 1: this is that child, locked down with its request. */
static int prespawn(struct sl_zygote *z)
{
    if (z->spare_pid != 0 || z->child == NULL || z->n_running != 0)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return 0; /* the Python loop makes one when the request comes */
    struct sl_child c = *z->child;
    c.ctl_fd = sv[1];
    c.parent_fd = sv[0];
    /* No run of the slot is alive (n_running is 0): the child may join the slot's namespace. */
    c.net_fd = shared_net(z);
    c.zygote_net_fd = z->zygote_net;
    unsigned long flags = c.net_fd >= 0 ? z->clone_flags & ~(unsigned long)CLONE_NEWNET : z->clone_flags;
    call(z->before_fork);
    long pid = sl_spawn(flags, &c, z->child_fds);
    if (pid == 0) {
        call(z->after_fork_child);
        return 1;
    }
    call(z->after_fork_parent);
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return 0;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pidfd < 0) {
        kill((pid_t)pid, SIGKILL);
        while (waitpid((pid_t)pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(sv[0]);
        return 0;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/%ld/ns/mnt", z->proc_dir, pid);
    z->spare_mntns = open(path, O_RDONLY | O_CLOEXEC);
    z->spare_pid = (int)pid;
    z->spare_ctl = sv[0];
    z->spare_pidfd = pidfd;
    z->spare_ready = 0;
    strcpy(z->spare_key, z->key);
    return 0;
}

/* Report each exited run on its status pipe (REC_EXIT + JSON, as protocol.write_record), then
 * prepare the next child. 1: this is that child. */
static int reap(struct sl_zygote *z)
{
    for (;;) {
        int status;
        struct rusage ru;
        pid_t pid = wait4(-1, &status, WNOHANG, &ru);
        if (pid <= 0)
            return 0;
        if (pid == z->spare_pid) { /* died before its request: replaced on the next run */
            close_spare(z);
            continue;
        }
        int i = 0;
        while (i < z->n_running && z->run_pid[i] != pid)
            i++;
        if (i == z->n_running)
            continue;
        close(z->run_pidfd[i]);
        char rec[256];
        int n = snprintf(rec + 5, sizeof rec - 5,
                         "{\"status\": %d, \"utime\": %.6f, \"stime\": %.6f, \"maxrss_kb\": %ld}",
                         status, (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
                         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6, ru.ru_maxrss);
        rec[0] = REC_EXIT;
        rec[1] = (char)(n & 0xff);
        rec[2] = (char)((n >> 8) & 0xff);
        rec[3] = rec[4] = 0;
        write_all(z->run_status[i], (const unsigned char *)rec, (size_t)n + 5);
        close(z->run_status[i]);
        z->n_running--;
        z->run_pid[i] = z->run_pid[z->n_running];
        z->run_status[i] = z->run_status[z->n_running];
        z->run_pidfd[i] = z->run_pidfd[z->n_running];
        if (prespawn(z))
            return 1;
    }
}

static void reply(struct sl_zygote *z, const char *text, int fd)
{
    send_fds(z->sock, text, strlen(text), &fd, fd >= 0 ? 1 : 0);
}

static int ready(int fd, int timeout_ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
        ;
    return r > 0;
}

/* A run for the prepared child (zygote.server.Zygote.handle, op "run", no session work dir).
 * 0: not one this loop serves (nothing was done: the Python loop handles it). */
static int serve_run(struct sl_zygote *z)
{
    int64_t mb, inodes;
    int32_t ncg;
    if (z->msg_len != RUN_HEAD || memcmp(z->msg, RUN_MAGIC, 4) != 0)
        return 0; /* another operation, or a session's work dir after the header */
    memcpy(&mb, z->msg + 4, 8);
    memcpy(&inodes, z->msg + 12, 8);
    memcpy(&ncg, z->msg + 20, 4);
    char key[128];
    snprintf(key, sizeof key, "size=%lldm,nr_inodes=%lld", (long long)mb, (long long)inodes);
    if (ncg < 1 || z->n_fds != N_RUN_FDS + ncg || z->spare_pid == 0 || z->n_running >= SL_MAX_RUNNING ||
        strcmp(key, z->spare_key) != 0 || strcmp(key, z->key) != 0)
        return 0;
    if (z->spare_ready) {
        if (ready(z->spare_ctl, 0)) { /* readable while idle: EOF, it died */
            discard_spare(z);
            return 0;
        }
    } else {
        char b[8];
        if (!ready(z->spare_ctl, 10000) || recv(z->spare_ctl, b, sizeof b, 0) != 1 || b[0] != CTL_READY) {
            discard_spare(z); /* its setup failed: the Python loop makes another and says why */
            return 0;
        }
        z->spare_ready = 1;
    }
    /* Into the run's own groups while it still waits for its request: everything the run does
     * is charged to them, and its processes are found there. */
    char text[512], pid[16];
    int plen = snprintf(pid, sizeof pid, "%d", z->spare_pid);
    for (int i = N_RUN_FDS; i < z->n_fds; i++) {
        if (write(z->fds[i], pid, (size_t)plen) != plen) {
            if (errno == ESRCH) { /* it died meanwhile: the Python loop makes a fresh one */
                discard_spare(z);
                return 0;
            }
            snprintf(text, sizeof text, "{\"ok\": false, \"error\": \"cannot move the child into "
                     "the run's cgroup: [Errno %d] %s\"}", errno, strerror(errno));
            discard_spare(z);
            return reply(z, text, -1), 1;
        }
    }
    if (send_fds(z->spare_ctl, CHILD_RUN, sizeof CHILD_RUN - 1, z->fds, N_RUN_FDS) < 0) {
        /* It died between the check and now (killed while idle): the Python loop makes a
         * fresh one. Moving a dead pid into the groups above left nothing behind. */
        discard_spare(z);
        return 0;
    }
    int status = fcntl(z->fds[FD_STATUS], F_DUPFD_CLOEXEC, 0);
    if (status < 0) { /* the child has its request: it runs, but nobody could report on it */
        snprintf(text, sizeof text, "{\"ok\": false, \"error\": \"dup: %s\"}", strerror(errno));
        discard_spare(z);
        return reply(z, text, -1), 1;
    }
    int i = z->n_running++;
    z->run_pid[i] = z->spare_pid;
    z->run_status[i] = status;
    z->run_pidfd[i] = z->spare_pidfd;
    /* The child's mount namespace goes to the supervisor (see zygote.server.Zygote.handle). */
    snprintf(text, sizeof text, "{\"ok\": true, \"pid\": %d}", z->spare_pid);
    reply(z, text, z->spare_mntns);
    z->spare_pidfd = -1;
    close_spare(z);
    z->fast_runs++;
    return 1;
}

/*
 * Run the loop until a message needs the Python loop (1: z->msg and z->fds hold it), the
 * supervisor hangs up (0), or a new child returns from sl_spawn (2: locked down, with its
 * run's descriptors in z->child_fds). -errno if waiting itself fails.
 */
int sl_serve(struct sl_zygote *z)
{
    if (reap(z))
        return 2;
    for (;;) {
        struct pollfd p[2 + SL_MAX_RUNNING];
        int n = 0;
        p[n++] = (struct pollfd){z->sock, POLLIN, 0};
        for (int i = 0; i < z->n_running; i++)
            p[n++] = (struct pollfd){z->run_pidfd[i], POLLIN, 0};
        if (z->spare_pid != 0)
            p[n++] = (struct pollfd){z->spare_pidfd, POLLIN, 0};
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        for (int i = 1; i < n; i++) {
            if (p[i].revents) { /* a run or the prepared child exited */
                if (reap(z))
                    return 2;
                break;
            }
        }
        if (!p[0].revents)
            continue;
        int n_fds;
        ssize_t got = recv_fds(z->sock, z->msg, sizeof z->msg, z->fds, SL_MAX_FDS, &n_fds);
        z->n_fds = n_fds < SL_MAX_FDS ? n_fds : SL_MAX_FDS;
        if (got <= 0) { /* the supervisor is gone */
            for (int i = 0; i < z->n_fds; i++)
                close(z->fds[i]);
            z->n_fds = 0;
            return 0;
        }
        z->msg_len = (int)got;
        if (!serve_run(z))
            return 1;
        for (int i = 0; i < z->n_fds; i++)
            close(z->fds[i]);
        z->n_fds = 0;
        if (reap(z))
            return 2;
    }
}
