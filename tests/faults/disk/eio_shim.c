/* An LD_PRELOAD library that makes writes fail with EIO, as a dying disk does.
 *
 * Device-mapper's `error` target is not available in containers, so the broker under test runs
 * with this library preloaded. It does nothing until the trigger file named by the environment
 * variable ODRADEK_EIO_TRIGGER exists; while it does, every write, pwrite, writev, fsync,
 * fdatasync and ftruncate on a file whose path starts with the prefix written in the trigger
 * file (its first line) fails with EIO, and so do rename, open-for-writing and mkdir under that
 * prefix. Removing the trigger file "repairs the disk". Built by the test with `cc -shared`.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <stdlib.h>

static int prefix_of_trigger(char *prefix, size_t size) {
    const char *trigger = getenv("ODRADEK_EIO_TRIGGER");
    if (trigger == NULL) return 0;
    static ssize_t (*real_read)(int, void *, size_t) = NULL;
    if (!real_read) real_read = dlsym(RTLD_NEXT, "read");
    int fd = syscall(SYS_openat, AT_FDCWD, trigger, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = real_read(fd, prefix, size - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    prefix[n] = '\0';
    char *newline = strchr(prefix, '\n');
    if (newline) *newline = '\0';
    return prefix[0] != '\0';
}

static int path_fails(const char *path) {
    char prefix[4096];
    if (path == NULL || !prefix_of_trigger(prefix, sizeof prefix)) return 0;
    char resolved[4096];
    const char *absolute = path;
    if (path[0] != '/') {
        if (realpath(".", resolved) == NULL) return 0;
        size_t used = strlen(resolved);
        snprintf(resolved + used, sizeof resolved - used, "/%s", path);
        absolute = resolved;
    }
    return strncmp(absolute, prefix, strlen(prefix)) == 0;
}

static int fd_fails(int fd) {
    char prefix[4096];
    if (!prefix_of_trigger(prefix, sizeof prefix)) return 0;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return 0;
    target[n] = '\0';
    return strncmp(target, prefix, strlen(prefix)) == 0;
}

#define REAL(ret, name, ...) \
    static ret (*real)(__VA_ARGS__) = NULL; \
    if (!real) real = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(ssize_t, write, int, const void *, size_t);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(ssize_t, pwrite, int, const void *, size_t, off_t);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(ssize_t, pwrite64, int, const void *, size_t, off_t);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    REAL(ssize_t, writev, int, const struct iovec *, int);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, iov, iovcnt);
}

int fsync(int fd) {
    REAL(int, fsync, int);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd);
}

int fdatasync(int fd) {
    REAL(int, fdatasync, int);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd);
}

int ftruncate(int fd, off_t length) {
    REAL(int, ftruncate, int, off_t);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, length);
}

int ftruncate64(int fd, off_t length) {
    REAL(int, ftruncate64, int, off_t);
    if (fd_fails(fd)) { errno = EIO; return -1; }
    return real(fd, length);
}

int rename(const char *old, const char *new) {
    REAL(int, rename, const char *, const char *);
    if (path_fails(old) || path_fails(new)) { errno = EIO; return -1; }
    return real(old, new);
}

int mkdir(const char *path, mode_t mode) {
    REAL(int, mkdir, const char *, mode_t);
    if (path_fails(path)) { errno = EIO; return -1; }
    return real(path, mode);
}

static int open_fails(const char *path, int flags) {
    return (flags & (O_WRONLY | O_RDWR | O_CREAT)) && path_fails(path);
}

int open(const char *path, int flags, ...) {
    REAL(int, open, const char *, int, ...);
    mode_t mode = 0;
    if (flags & O_CREAT) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    if (open_fails(path, flags)) { errno = EIO; return -1; }
    return real(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    REAL(int, open64, const char *, int, ...);
    mode_t mode = 0;
    if (flags & O_CREAT) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    if (open_fails(path, flags)) { errno = EIO; return -1; }
    return real(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL(int, openat, int, const char *, int, ...);
    mode_t mode = 0;
    if (flags & O_CREAT) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    if ((dirfd == AT_FDCWD || path[0] == '/') && open_fails(path, flags)) { errno = EIO; return -1; }
    return real(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    REAL(int, openat64, int, const char *, int, ...);
    mode_t mode = 0;
    if (flags & O_CREAT) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    if ((dirfd == AT_FDCWD || path[0] == '/') && open_fails(path, flags)) { errno = EIO; return -1; }
    return real(dirfd, path, flags, mode);
}
