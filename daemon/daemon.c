/* daemon/daemon.c: the daemon's start (see daemon/daemon.h). */
#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/cli.h"
#include "daemon/pidfile.h"

int daemon_prepare(struct daemon *d, const char *pidfile_path)
{
    d->pidfile_path = pidfile_path;
    d->pf = NULL;
    d->ready_fd = -1;
    return pidfile_path ? pidfile_prepare(pidfile_path, &d->pf) : 0;
}

/* The parent: wait for the child's byte, exit with it (or with the
 * child's own failing status when it died without a word). */
static void __attribute__((noreturn)) wait_ready(int fd, pid_t pid)
{
    unsigned char status = 1;

    if (read(fd, &status, 1) != 1) {
        int ws;
        status = 1;
        if (waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) &&
            WEXITSTATUS(ws) != 0)
            status = (unsigned char) WEXITSTATUS(ws);
    }
    _exit(status);
}

void daemon_fork(struct daemon *d)
{
    int p[2];

    if (pipe(p) == -1) {
        perror(CLI_PROGRAM);
        exit(EXIT_FAILURE);
    }
    pid_t pid = fork();
    if (pid == -1) {
        perror(CLI_PROGRAM);
        exit(EXIT_FAILURE);
    }
    if (pid > 0) {
        close(p[1]);
        wait_ready(p[0], pid);
    }
    close(p[0]);
    d->ready_fd = p[1];
    setsid();
}

int daemon_write_pidfile(struct daemon *d)
{
    if (!d->pf)
        return 0;
    int r = pidfile_write(d->pf);
    if (r < 0)
        log_err("pidfile %s: %s", d->pidfile_path, strerror(-r));
    return r;
}

void daemon_detach(struct daemon *d)
{
    if (d->ready_fd < 0)
        return;
    unsigned char ok = 0;
    int null = open("/dev/null", O_RDWR);
    if (write(d->ready_fd, &ok, 1) != 1) {
        /* the parent is gone: nobody to tell */
    }
    close(d->ready_fd);
    d->ready_fd = -1;
    log_set_syslog(true);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        if (null > STDERR_FILENO)
            close(null);
    }
    if (chdir("/") == -1) {
        /* harmless */
    }
}

void daemon_fini(struct daemon *d)
{
    pidfile_remove(d->pf);    /* only if it still holds our pid */
    d->pf = NULL;
}
