/* An LD_PRELOAD shim that makes fsync and fdatasync fail with EIO while a file exists.
 *
 * The tests build it with `cc -shared -fPIC` and start a server with LD_PRELOAD pointing at
 * it and MAXQ_FAIL_FSYNC_FILE naming a trigger path: while that path exists, every fsync and
 * fdatasync of the process (RocksDB's WAL sync, the Raft journal's fdatasync) returns -1 with
 * errno EIO, as a failing disk does; the data written stays in the page cache, which after such
 * an error can no longer be trusted (PostgreSQL's "fsyncgate"). Without the trigger the real
 * calls run.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

static int failing(void) {
    const char *trigger = getenv("MAXQ_FAIL_FSYNC_FILE");
    struct stat st;
    return trigger != NULL && stat(trigger, &st) == 0;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing()) {
        errno = EIO;
        return -1;
    }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
