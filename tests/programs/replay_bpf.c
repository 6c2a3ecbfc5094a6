/* replay_bpf.c: the whole user space of the kernel tier's guest.  Runs as /init
 * of an initramfs booted with Debian's own kernel, loads every program that
 * record_bpf.c recorded on the host into this kernel's verifier, once per
 * mode (a set of capabilities, as the shipped units give), says what the
 * verifier answered on the console, and powers the guest off.
 *
 *   progs/NAME.rec recordings (format: record_bpf.c)
 *   modes          one line per mode: NAME CAPABILITY-MASK-IN-HEX (or "all": every
 *                  capability init has)
 *
 * Each program's maps are made again from their recorded shape (contents are
 * not the verifier's business), its BTF loaded again, the map fds in its
 * 64-bit loads replaced by the new ones, then BPF_PROG_LOAD.  A mode runs in a
 * child process that keeps only that mode's capabilities (uid 0 with nothing
 * else is what the verifier sees of a unit's ambient capabilities: it asks
 * capable(), never the uid).
 *
 * Console lines, one per program and mode:
 *   ALFK MODE CASE INDEX NAME ok INSNS insns, PROCESSED processed
 *   ALFK MODE CASE INDEX NAME fail ERRNO      followed by
 *   ALFKLOG MODE CASE INDEX: <a line of the verifier's log>  (its last 40 lines)
 * and "ALFK-DONE" at the end.
 *
 * Built by tests/helpers/guest_kernel.py: gcc -static -O2 -o init replay_bpf.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/capability.h>
#include <linux/reboot.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOG_SIZE (16u << 20)

static long bpf(int cmd, union bpf_attr *attr)
{
    return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

struct reader {
    const unsigned char *p, *end;
    int bad;
};

static uint32_t get32(struct reader *r)
{
    uint32_t v = 0;
    if (r->end - r->p < 4) {
        r->bad = 1;
        return 0;
    }
    memcpy(&v, r->p, 4);
    r->p += 4;
    return v;
}

static const void *getbytes(struct reader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return NULL;
    }
    const void *at = r->p;
    r->p += n;
    return at;
}

static const void *getblob(struct reader *r, uint32_t *len)
{
    *len = get32(r);
    return getbytes(r, *len);
}

static char *logbuf;

/* Print the last `lines` lines of the verifier log, each prefixed. */
static void print_log_tail(const char *prefix, int lines)
{
    size_t len = strnlen(logbuf, LOG_SIZE);
    const char *start = logbuf + len;
    int seen = 0;
    while (start > logbuf && seen <= lines) {
        start--;
        if (*start == '\n')
            seen++;
    }
    if (*start == '\n')
        start++;
    while (*start) {
        const char *nl = strchr(start, '\n');
        int n = nl ? (int)(nl - start) : (int)strlen(start);
        if (n)
            printf("%s%.*s\n", prefix, n, start);
        if (!nl)
            break;
        start = nl + 1;
    }
}

/* Replays the records of one file; returns the number of failures. */
static int replay_file(const char *mode, const char *path)
{
    char caseName[600];
    const char *base = strrchr(path, '/');
    snprintf(caseName, sizeof(caseName), "%s", base ? base + 1 : path);
    char *dot = strrchr(caseName, '.');
    if (dot)
        *dot = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        printf("ALFK %s %s 0 - fail %d (open)\n", mode, caseName, errno);
        return 1;
    }
    struct stat st;
    fstat(fd, &st);
    unsigned char *data = malloc(st.st_size + 1);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, data + got, st.st_size - got);
        if (n <= 0)
            break;
        got += n;
    }
    close(fd);
    struct reader r = {data, data + got, 0};
    int failures = 0;
    for (int index = 0; r.p < r.end && !r.bad; index++) {
        const char *magic = getbytes(&r, 4);
        if (!magic || memcmp(magic, "ALFR", 4)) {
            printf("ALFK %s %s %d - fail 0 (bad record)\n", mode, caseName, index);
            failures++;
            break;
        }
        union bpf_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.prog_type = get32(&r);
        attr.expected_attach_type = get32(&r);
        attr.prog_flags = get32(&r);
        attr.kern_version = get32(&r);
        const char *name = getbytes(&r, 16);
        int32_t host_result = (int32_t)get32(&r);
        uint32_t license_len, btf_len, insn_cnt;
        const char *license = getblob(&r, &license_len);
        insn_cnt = get32(&r);
        const struct bpf_insn *recorded = getbytes(&r, (size_t)insn_cnt * 8);
        const void *btf = getblob(&r, &btf_len);
        uint32_t fi_size = get32(&r), fi_cnt = get32(&r);
        const void *fi = getbytes(&r, (size_t)fi_size * fi_cnt);
        uint32_t li_size = get32(&r), li_cnt = get32(&r);
        const void *li = getbytes(&r, (size_t)li_size * li_cnt);
        uint32_t map_count = get32(&r);
        int old_fd[256], new_fd[256];
        int maps = 0, map_failed = 0;
        char label[64];
        snprintf(label, sizeof(label), "%.16s", name ? name : "");
        if (!label[0])
            snprintf(label, sizeof(label), "-");
        for (uint32_t m = 0; m < map_count && !r.bad; m++) {
            union bpf_attr ma;
            memset(&ma, 0, sizeof(ma));
            uint32_t old = get32(&r);
            ma.map_type = get32(&r);
            ma.key_size = get32(&r);
            ma.value_size = get32(&r);
            ma.max_entries = get32(&r);
            ma.map_flags = get32(&r);
            const char *mname = getbytes(&r, 16);
            const uint64_t *extra = getbytes(&r, 8);
            union bpf_attr ia; /* the shape of the maps a map of maps holds */
            memset(&ia, 0, sizeof(ia));
            ia.map_type = get32(&r);
            ia.key_size = get32(&r);
            ia.value_size = get32(&r);
            ia.max_entries = get32(&r);
            ia.map_flags = get32(&r);
            if (r.bad)
                break;
            memcpy(ma.map_name, mname, 15);
            if (extra)
                memcpy(&ma.map_extra, extra, 8);
            int inner = -1;
            if (ia.map_type) {
                inner = bpf(BPF_MAP_CREATE, &ia);
                if (inner < 0)
                    printf("ALFK %s %s %d %s fail %d (inner map of %.16s type %u: %s)\n", mode,
                           caseName, index, label, errno, mname, ia.map_type, strerror(errno));
                ma.inner_map_fd = inner < 0 ? 0 : inner;
            }
            int nfd = bpf(BPF_MAP_CREATE, &ma);
            if (inner >= 0)
                close(inner); /* a template: the map of maps keeps its shape */
            if (nfd < 0) {
                printf("ALFK %s %s %d %s fail %d (map %.16s type %u: %s)\n", mode, caseName,
                       index, label, errno, mname, ma.map_type, strerror(errno));
                map_failed = 1;
            }
            if (maps < 256) {
                old_fd[maps] = (int)old;
                new_fd[maps] = nfd;
                maps++;
            }
        }
        if (r.bad) {
            printf("ALFK %s %s %d - fail 0 (truncated record)\n", mode, caseName, index);
            failures++;
            break;
        }
        int ours = attr.prog_type == BPF_PROG_TYPE_SOCKET_FILTER ||
                   (attr.prog_type == BPF_PROG_TYPE_XDP && strstr(path, ".early.rec"));
        if (host_result < 0 || !ours) {
            /* libbpf's feature probes, and what the host refused too: not ours to judge */
            for (int m = 0; m < maps; m++)
                if (new_fd[m] >= 0)
                    close(new_fd[m]);
            continue;
        }
        if (map_failed) {
            failures++;
            for (int m = 0; m < maps; m++)
                if (new_fd[m] >= 0)
                    close(new_fd[m]);
            continue;
        }
        struct bpf_insn *insns = malloc((size_t)insn_cnt * 8 + 8);
        memcpy(insns, recorded, (size_t)insn_cnt * 8);
        for (uint32_t i = 0; i + 1 < insn_cnt; i++) {
            if (insns[i].code != (BPF_LD | BPF_DW | BPF_IMM))
                continue;
            if (insns[i].src_reg == BPF_PSEUDO_MAP_FD || insns[i].src_reg == BPF_PSEUDO_MAP_VALUE)
                for (int m = 0; m < maps; m++)
                    if (old_fd[m] == insns[i].imm) {
                        insns[i].imm = new_fd[m];
                        break; /* a new fd may equal another map's old one */
                    }
            i++;
        }
        int btf_fd = -1;
        if (btf_len) {
            union bpf_attr ba;
            memset(&ba, 0, sizeof(ba));
            ba.btf = (uint64_t)(uintptr_t)btf;
            ba.btf_size = btf_len;
            btf_fd = bpf(BPF_BTF_LOAD, &ba);
            if (btf_fd < 0)
                printf("ALFKNOTE %s %s %d: BTF refused (%s): loading without it\n", mode,
                       caseName, index, strerror(errno));
        }
        attr.insns = (uint64_t)(uintptr_t)insns;
        attr.insn_cnt = insn_cnt;
        attr.license = (uint64_t)(uintptr_t)(license_len ? license : "GPL");
        memcpy(attr.prog_name, name, 15);
        if (btf_fd >= 0) {
            attr.prog_btf_fd = btf_fd;
            attr.func_info_rec_size = fi_size;
            attr.func_info_cnt = fi_cnt;
            attr.func_info = (uint64_t)(uintptr_t)fi;
            attr.line_info_rec_size = li_size;
            attr.line_info_cnt = li_cnt;
            attr.line_info = (uint64_t)(uintptr_t)li;
        }
        /* Statistics only (BPF_LOG_STATS): the instructions the verifier processed. */
        logbuf[0] = 0;
        attr.log_level = 4;
        attr.log_size = 4096;
        attr.log_buf = (uint64_t)(uintptr_t)logbuf;
        int pfd = bpf(BPF_PROG_LOAD, &attr);
        if (pfd >= 0) {
            const char *stats = strstr(logbuf, "processed ");
            unsigned processed = 0;
            if (stats)
                sscanf(stats, "processed %u", &processed);
            printf("ALFK %s %s %d %s ok %u insns, %u processed\n", mode, caseName, index, label,
                   insn_cnt, processed);
            close(pfd);
        } else {
            int err = errno;
            /* Again, for the verifier's log (writing it costs more than verifying). */
            logbuf[0] = 0;
            attr.log_level = 1;
            attr.log_size = LOG_SIZE;
            attr.log_buf = (uint64_t)(uintptr_t)logbuf;
            int again = bpf(BPF_PROG_LOAD, &attr);
            if (again >= 0)
                close(again);
            printf("ALFK %s %s %d %s fail %d (%s)\n", mode, caseName, index, label, err,
                   strerror(err));
            char prefix[768];
            snprintf(prefix, sizeof(prefix), "ALFKLOG %s %s %d: ", mode, caseName, index);
            print_log_tail(prefix, 40);
            failures++;
        }
        fflush(stdout);
        free(insns);
        if (btf_fd >= 0)
            close(btf_fd);
        for (int m = 0; m < maps; m++)
            if (new_fd[m] >= 0)
                close(new_fd[m]);
    }
    free(data);
    return failures;
}

static int keep_only(uint64_t mask)
{
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    for (int i = 0; i < 2; i++) {
        data[i].effective = data[i].permitted = (uint32_t)(mask >> (32 * i));
    }
    return syscall(SYS_capset, &header, data);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static void replay_mode(const char *mode, int all, uint64_t caps)
{
    if (!all && keep_only(caps) < 0) {
        printf("ALFK %s - 0 - fail %d (capset)\n", mode, errno);
        return;
    }
    struct dirent **names;
    int n = scandir("progs", &names, NULL, by_name);
    for (int i = 0; i < n; i++) {
        /* Early drop's XDP programs (NAME.early.rec) are root's alone: an XDP program
         * needs CAP_NET_ADMIN, which no shipped unit and not the loader holds. */
        int root_only = strstr(names[i]->d_name, ".early.rec") != NULL;
        if (strstr(names[i]->d_name, ".rec") && (all || !root_only)) {
            char path[512];
            snprintf(path, sizeof(path), "progs/%s", names[i]->d_name);
            replay_file(mode, path);
        }
        free(names[i]);
    }
    free(names);
}

int main(void)
{
    if (getpid() == 1) {
        mkdir("/dev", 0755);
        mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
        int con = open("/dev/console", O_RDWR);
        if (con >= 0) {
            dup2(con, 0);
            dup2(con, 1);
            dup2(con, 2);
        }
        mkdir("/proc", 0755);
        mount("proc", "/proc", "proc", 0, NULL);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    logbuf = malloc(LOG_SIZE);
    struct utsname_like { char s[256]; } release;
    FILE *v = fopen("/proc/sys/kernel/osrelease", "r");
    if (v && fgets(release.s, sizeof(release.s), v))
        printf("ALFK-KERNEL %s", release.s);
    if (v)
        fclose(v);
    FILE *modes = fopen("modes", "r");
    char line[256];
    while (modes && fgets(line, sizeof(line), modes)) {
        char name[64];
        char mask[64];
        if (sscanf(line, "%63s %63s", name, mask) != 2)
            continue;
        int all = !strcmp(mask, "all");
        unsigned long long caps = strtoull(mask, NULL, 16);
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            replay_mode(name, all, caps);
            fflush(stdout);
            _exit(0);
        }
        int status;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status))
            printf("ALFK %s - 0 - fail 0 (the mode's process died: status %d)\n", name, status);
    }
    printf("ALFK-DONE\n");
    fflush(stdout);
    sync();
    if (getpid() == 1)
        reboot(RB_POWER_OFF);
    return 0;
}
