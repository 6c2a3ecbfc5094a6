/* record_bpf.c: an LD_PRELOAD library that records every BPF_PROG_LOAD a process
 * makes, with what the verifier needs to check that program again on another
 * kernel: its instructions, license, flags and name, its BTF with func_info and
 * line_info, and the shape of every map its instructions name (type, key and
 * value size, entries, flags), read from the live map fd at that moment (a map
 * renamed by dup2 or taken from a pin is recorded as it is then).  Map contents
 * are not recorded: the verifier does not read them (no map here is frozen).
 *
 * libbpf (and so BCC) calls bpf(2) through syscall(3); this wraps syscall().
 * Records are appended to the file named by $ALF_RECORD_BPF at the time of the
 * call; nothing is recorded while it is unset.  The format (all little-endian
 * u32 unless said otherwise) is read by replay_bpf.c:
 *
 *   "ALFR" prog_type expected_attach_type prog_flags kern_version
 *   name[16] host_result(i32: fd >= 0 -> 0, else -errno)
 *   license_len license  insn_cnt insns[8 * insn_cnt]
 *   btf_len btf  func_info_rec_size func_info_cnt func_info
 *   line_info_rec_size line_info_cnt line_info
 *   map_count, then per map: old_fd type key_size value_size max_entries map_flags
 *   name[16] map_extra(u64), then the shape of the maps it holds (an array or hash
 *   of maps: what its BPF_MAP_CREATE took as inner_map_fd; zeros for other maps):
 *   inner_type inner_key_size inner_value_size inner_max_entries inner_map_flags
 *
 * Built by tests/helpers/guest_kernel.py: gcc -shared -fPIC -o record_bpf.so record_bpf.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/bpf.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef long (*syscall_fn)(long, ...);

static long real_syscall(long n, long a, long b, long c, long d, long e, long f)
{
    static syscall_fn next;
    if (!next)
        next = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
    return next(n, a, b, c, d, e, f);
}

static long bpf_call(int cmd, union bpf_attr *attr, unsigned size)
{
    return real_syscall(__NR_bpf, cmd, (long)attr, size, 0, 0, 0);
}

static void put32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void put64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void putblob(FILE *f, const void *p, uint32_t len)
{
    put32(f, len);
    if (len)
        fwrite(p, 1, len, f);
}

/* The BTF object behind fd, as raw bytes (malloc'd), or NULL. */
static void *btf_bytes(int fd, uint32_t *len)
{
    struct bpf_btf_info info;
    union bpf_attr attr;
    memset(&info, 0, sizeof(info));
    memset(&attr, 0, sizeof(attr));
    attr.info.bpf_fd = fd;
    attr.info.info_len = sizeof(info);
    attr.info.info = (uint64_t)(uintptr_t)&info;
    if (bpf_call(BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof(attr)) < 0 || !info.btf_size)
        return NULL;
    uint32_t size = info.btf_size;
    void *buf = calloc(1, size);
    memset(&info, 0, sizeof(info));
    info.btf = (uint64_t)(uintptr_t)buf;
    info.btf_size = size;
    attr.info.info_len = sizeof(info);
    if (bpf_call(BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof(attr)) < 0) {
        free(buf);
        return NULL;
    }
    *len = size;
    return buf;
}

static int map_info(int fd, struct bpf_map_info *info)
{
    union bpf_attr attr;
    memset(info, 0, sizeof(*info));
    memset(&attr, 0, sizeof(attr));
    attr.info.bpf_fd = fd;
    attr.info.info_len = sizeof(*info);
    attr.info.info = (uint64_t)(uintptr_t)info;
    return bpf_call(BPF_OBJ_GET_INFO_BY_FD, &attr, sizeof(attr)) < 0 ? -1 : 0;
}

/* The inner map shape of each map of maps this process made, by fd number (a copy
 * dup2'd over BCC's fd was made with the same shape). */
#define INNER_FDS 4096
static struct bpf_map_info inner_of[INNER_FDS];

static void note_map_create(const union bpf_attr *attr, long fd)
{
    if (fd < 0 || fd >= INNER_FDS)
        return;
    memset(&inner_of[fd], 0, sizeof(inner_of[fd]));
    if (attr->inner_map_fd && map_info((int)attr->inner_map_fd, &inner_of[fd]) < 0)
        memset(&inner_of[fd], 0, sizeof(inner_of[fd]));
}

/* The inner shape of a map of maps this process did not make (a named set's
 * hosts_at, taken from its pin): that of the map in its slot 0, opened by id where
 * this process may (CAP_SYS_ADMIN), else that of a hash map a map of maps this
 * process made holds (the sets' placeholders, made for the same shape).  0 if
 * neither is found. */
static int inner_of_held(int fd, struct bpf_map_info *out)
{
    uint32_t key = 0, id = 0;
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.map_fd = (uint32_t)fd;
    attr.key = (uint64_t)(uintptr_t)&key;
    attr.value = (uint64_t)(uintptr_t)&id;
    if (bpf_call(BPF_MAP_LOOKUP_ELEM, &attr, sizeof(attr)) == 0 && id) {
        memset(&attr, 0, sizeof(attr));
        attr.map_id = id;
        long held = bpf_call(BPF_MAP_GET_FD_BY_ID, &attr, sizeof(attr));
        if (held >= 0) {
            int ok = map_info((int)held, out) == 0;
            real_syscall(__NR_close, held, 0, 0, 0, 0, 0);
            if (ok)
                return 1;
        }
    }
    for (int i = 0; i < INNER_FDS; i++) {
        if (inner_of[i].type == BPF_MAP_TYPE_HASH) {
            *out = inner_of[i];
            return 1;
        }
    }
    return 0;
}

static void record(const union bpf_attr *attr, long result, int err)
{
    const char *path = getenv("ALF_RECORD_BPF");
    if (!path || !*path)
        return;
    FILE *f = fopen(path, "ab");
    if (!f)
        return;
    const struct bpf_insn *insns = (const struct bpf_insn *)(uintptr_t)attr->insns;
    const char *license = (const char *)(uintptr_t)attr->license;
    fwrite("ALFR", 1, 4, f);
    put32(f, attr->prog_type);
    put32(f, attr->expected_attach_type);
    put32(f, attr->prog_flags);
    put32(f, attr->kern_version);
    fwrite(attr->prog_name, 1, 16, f);
    put32(f, (uint32_t)(int32_t)(result >= 0 ? 0 : -err));
    putblob(f, license, license ? strlen(license) + 1 : 0);
    put32(f, attr->insn_cnt);
    fwrite(insns, sizeof(*insns), attr->insn_cnt, f);
    uint32_t btf_len = 0;
    void *btf = attr->prog_btf_fd ? btf_bytes(attr->prog_btf_fd, &btf_len) : NULL;
    putblob(f, btf, btf_len);
    free(btf);
    uint32_t with_btf = btf_len ? 1 : 0;
    put32(f, with_btf * attr->func_info_rec_size);
    put32(f, with_btf * attr->func_info_cnt);
    fwrite((void *)(uintptr_t)attr->func_info, 1,
           with_btf * attr->func_info_rec_size * attr->func_info_cnt, f);
    put32(f, with_btf * attr->line_info_rec_size);
    put32(f, with_btf * attr->line_info_cnt);
    fwrite((void *)(uintptr_t)attr->line_info, 1,
           with_btf * attr->line_info_rec_size * attr->line_info_cnt, f);
    /* The maps: every fd named by a 64-bit load of a map (BPF_PSEUDO_MAP_FD or
     * BPF_PSEUDO_MAP_VALUE), each once. */
    int fds[256], n = 0;
    for (uint32_t i = 0; i + 1 < attr->insn_cnt; i++) {
        if (insns[i].code != (BPF_LD | BPF_DW | BPF_IMM))
            continue;
        if (insns[i].src_reg == BPF_PSEUDO_MAP_FD || insns[i].src_reg == BPF_PSEUDO_MAP_VALUE) {
            int seen = 0;
            for (int j = 0; j < n; j++)
                seen |= fds[j] == insns[i].imm;
            if (!seen && n < 256)
                fds[n++] = insns[i].imm;
        }
        i++; /* the second half of the 16-byte instruction */
    }
    put32(f, n);
    for (int j = 0; j < n; j++) {
        struct bpf_map_info info;
        if (map_info(fds[j], &info) < 0)
            memset(&info, 0, sizeof(info));
        put32(f, fds[j]);
        put32(f, info.type);
        put32(f, info.key_size);
        put32(f, info.value_size);
        put32(f, info.max_entries);
        put32(f, info.map_flags);
        fwrite(info.name, 1, 16, f);
        put64(f, info.map_extra);
        struct bpf_map_info none, held, *inner = &none;
        memset(&none, 0, sizeof(none));
        if ((info.type == BPF_MAP_TYPE_ARRAY_OF_MAPS || info.type == BPF_MAP_TYPE_HASH_OF_MAPS)
            && fds[j] >= 0 && fds[j] < INNER_FDS) {
            inner = &inner_of[fds[j]];
            if (!inner->type && inner_of_held(fds[j], &held))
                inner = &held; /* one this process took from a pin */
        }
        put32(f, inner->type);
        put32(f, inner->key_size);
        put32(f, inner->value_size);
        put32(f, inner->max_entries);
        put32(f, inner->map_flags);
    }
    fclose(f);
}

long syscall(long n, ...)
{
    va_list ap;
    long a[6];
    va_start(ap, n);
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    long result = real_syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
    if (n == __NR_bpf && a[0] == BPF_MAP_CREATE)
        note_map_create((const union bpf_attr *)a[1], result);
    if (n == __NR_bpf && a[0] == BPF_PROG_LOAD) {
        int saved = errno;
        record((const union bpf_attr *)a[1], result, saved);
        errno = saved;
    }
    return result;
}
