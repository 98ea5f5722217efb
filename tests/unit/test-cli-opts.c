/* Unit test for cli_add_fuse_opts() (daemon/cli.c): which -o items nbdferry
 * takes, what reaches libfuse (escaped commas kept as one item), and the
 * errors for bad owner values and over-long items. */
#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/cli.h"

static struct nbdf_err err;

static int add(struct cli_fuse_opts *fo, const char *arg)
{
    err.msg[0] = '\0';
    return cli_add_fuse_opts(fo, arg, &err);
}

static void pass_is(const struct cli_fuse_opts *fo, const char *want)
{
    if (!want)
        assert(fo->pass == NULL);
    else
        assert(fo->pass && strcmp(fo->pass, want) == 0);
}

int main(void)
{
    struct cli_fuse_opts fo = { 0 };

    /* Ours are taken out; nothing is left for libfuse. */
    assert(add(&fo, "nonempty,kernel_cache") == 0);
    assert(add(&fo, "block_device,vhd_fixed") == 0);
    assert(fo.nonempty && fo.kernel_cache && fo.block_device && fo.vhd_fixed);
    pass_is(&fo, NULL);
    /* digest=SPEC is ours, kept as given (main() judges it); the last
     * one counts. */
    assert(add(&fo, "digest=none,digest=blkhash/md5/4k") == 0);
    assert(fo.digest && strcmp(fo.digest, "blkhash/md5/4k") == 0);
    pass_is(&fo, NULL);

    /* The rest reaches libfuse in order, over several -o; empty items
     * vanish; an escaped comma stays inside its item. */
    assert(add(&fo, ",,ro,,allow_other,") == 0);
    pass_is(&fo, "ro,allow_other");
    assert(add(&fo, "fsname=a\\,b,uid=5,gid=7") == 0);
    pass_is(&fo, "ro,allow_other,fsname=a\\,b");
    assert(fo.set_uid && fo.uid == 5 && fo.set_gid && fo.gid == 7);
    /* "uid" without a value is not ours (libfuse judges it). */
    assert(add(&fo, "uid") == 0);
    pass_is(&fo, "ro,allow_other,fsname=a\\,b,uid");
    cli_fuse_opts_free(&fo);
    pass_is(&fo, NULL);
    assert(fo.digest == NULL);

    /* Bad owners: the message names the option. */
    memset(&fo, 0, sizeof fo);
    assert(add(&fo, "ro,uid=alice") == -EINVAL);
    assert(strstr(err.msg, "-o uid") && strstr(err.msg, "alice"));
    assert(!fo.set_uid);
    assert(add(&fo, "gid=4294967295") == -ERANGE);
    assert(strstr(err.msg, "-o gid"));
    assert(add(&fo, "gid=") == -EINVAL);
    /* Without a struct nbdf_err: the same code, no message. */
    assert(cli_add_fuse_opts(&fo, "uid=alice", NULL) == -EINVAL);
    cli_fuse_opts_free(&fo);

    /* An item of 1024 bytes or more is refused. */
    static char big[1100];
    memset(big, 'x', 1023);
    memcpy(big, "fsname=", 7);
    memset(&fo, 0, sizeof fo);
    assert(add(&fo, big) == 0);               /* 1023: fine */
    big[1023] = 'x';
    assert(add(&fo, big) == -EINVAL && strstr(err.msg, "too long"));
    cli_fuse_opts_free(&fo);
    printf("cli-opts: ok\n");
    return 0;
}
