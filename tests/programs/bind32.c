/* bind32.c: a 64-bit program that binds a UDP socket through the 32-bit entry points
 * (int $0x80: socketcall(SYS_BIND) and bind), as a daemon trying to get past a filter
 * of the native ABI's calls would; then getpid, as any 32-bit helper program calls.
 * Prints each call's result and errno, then "done".
 *     bind32 PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

static long int80(long nr, long a, long b, long c)
{
    long ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
    return ret;
}

static void said(const char *what, long r)
{
    printf("%s %ld %ld\n", what, r < 0 ? -1L : r, r < 0 ? -r : 0L);
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 9400;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    /* What int $0x80 is given must lie below 4 GiB. */
    char *low = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT,
                     -1, 0);
    if (fd < 0 || low == MAP_FAILED)
        return 1;
    struct sockaddr_in *sa = (struct sockaddr_in *)low;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    unsigned int *args = (unsigned int *)(low + 64);
    args[0] = fd;
    args[1] = (unsigned int)(unsigned long)sa;
    args[2] = sizeof *sa;
    said("socketcall bind", int80(102 /* socketcall */, 2 /* SYS_BIND */, (long)(unsigned long)args, 0));
    said("bind", int80(361 /* i386 bind */, fd, (long)(unsigned long)sa, sizeof *sa));
    said("getpid", int80(20 /* i386 getpid */, 0, 0, 0)); /* any other call works */
    printf("done\n");
    fflush(stdout);
    return 0;
}
