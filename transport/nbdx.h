/* transport/nbdx.h: NBD connections, one I/O thread each.
 *
 * nbdx owns the libnbd handles.  Callers describe a request in a
 * struct nbdx_op and hand it to nbdx_submit(); the op's done() callback
 * runs later on the connection's I/O thread, outside any libnbd call.
 * nbdx does not order requests: callers never submit two overlapping
 * requests at once (the pool guarantees it for the daemon).
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

enum nbdx_mode {
    NBDX_URI,                 /* nbd://, nbd+unix://, nbds:// ... */
    NBDX_SOCKET_ACTIVATION,   /* [ CMD ARGS ]: libnbd starts the server */
    NBDX_COMMAND,             /* --command: server on stdin/stdout */
    NBDX_UNIX,                /* --unix SOCKET */
    NBDX_TCP,                 /* --tcp HOST PORT */
    NBDX_FD,                  /* --fd N: an already connected socket */
};

#define NBDX_TLS_FROM_URI (-1)

struct nbdx_config {
    enum nbdx_mode mode;
    const char *uri;          /* NBDX_URI */
    char **argv;              /* NBDX_SOCKET_ACTIVATION, NBDX_COMMAND */
    const char *path;         /* NBDX_UNIX */
    const char *host, *port;  /* NBDX_TCP */
    int fd;                   /* NBDX_FD */
    unsigned connections;     /* wanted; 1 unless the server offers multi-conn */
    bool readonly;
    bool nodelay;             /* TCP_NODELAY on TCP sockets (default on) */
    bool debug;               /* libnbd debug messages */
    int tls;                  /* NBDX_TLS_FROM_URI (nbds:// requires it),
                               * else LIBNBD_TLS_DISABLE/ALLOW/REQUIRE */
    const char *tls_psk_file, *tls_username, *tls_certificates;
    bool tls_verify_peer;     /* accepted; verifying is the default */
    bool tls_insecure;        /* X.509 without verifying the server: the
                               * explicit, logged opt-out */
    unsigned retry_timeout_s; /* reconnect and resend for this long when a
                               * connection dies (URI, unix, tcp); 0: fail */
    const char *log_subject;  /* the connection threads' log lines start
                               * with it (log_set_thread_subject()); NULL:
                               * none.  Borrowed: outlives the nbdx */
    unsigned request_timeout_s; /* no reply progress for this long with
                                 * requests outstanding (or a handshake
                                 * this slow) counts as a lost
                                 * connection; 0: wait forever */
};

/* What the server told us at handshake. */
struct nbdx_info {
    uint64_t size;
    bool readonly;
    bool can_flush, can_zero, can_fast_zero, can_multi_conn, can_extents;
    bool tcp;                 /* the connections are TCP sockets */
    uint32_t block_min, block_pref, block_max;  /* 0 where not advertised */
    unsigned connections;     /* actually opened */
    /* NBD extended headers negotiated on every connection (never when
     * built without them: nbdx_ext_headers_built()).  Then write-zeroes
     * and block status may cover more than 4 GiB each. */
    bool ext_headers;
};

/* Whether this build can negotiate NBD extended headers (libnbd >= 1.18,
 * decided by CMakeLists.txt from libnbd's API). */
bool nbdx_ext_headers_built(void);

enum nbdx_kind {
    NBDX_OP_READ,
    NBDX_OP_WRITE,
    NBDX_OP_ZERO,
    NBDX_OP_FLUSH,
    NBDX_OP_BLOCK_STATUS,
};
#define NBDX_NKINDS (NBDX_OP_BLOCK_STATUS + 1)

struct nbdx_op;
typedef void (*nbdx_done_fn)(struct nbdx_op *op, int err);
/* Called for each extent of a block status reply, on the I/O thread,
 * inside libnbd: record the extent, call nothing in libnbd. */
typedef void (*nbdx_extent_fn)(struct nbdx_op *op, uint64_t off,
                               uint64_t len, uint32_t flags);

struct nbdx_op {
    enum nbdx_kind kind;
    uint64_t off, len;
    void *buf;                /* READ, WRITE: borrowed until done() */
    uint32_t flags;           /* LIBNBD_CMD_FLAG_* */
    nbdx_done_fn done;        /* err is 0 or a positive errno */
    nbdx_extent_fn extent;    /* BLOCK_STATUS only */
    void *opaque;             /* the caller's */

    /* Private to nbdx. */
    struct nbdx_op *next;
    struct nbdx_op *wprev, *wnext;    /* on the wire: libnbd holds buf */
    struct nbdx_conn *conn;
    int err;
    bool completed;
    bool on_wire;
};

struct nbdx;

/* Connects every connection and completes the handshake.  On error,
 * logs one line naming the server and returns -errno. */
int nbdx_open(const struct nbdx_config *cfg, struct nbdx **out);
const struct nbdx_info *nbdx_info(const struct nbdx *x);

/* For connections of the caller's own beside the mount's (--list,
 * --all-exports): cfg's TLS policy applied as nbdx_open() applies it (the
 * server verified or refused; a CA directory made, keys held), without
 * connecting.  nbdx_config() is cfg as the policy left it, for
 * nbdx_configure_handle(); nbdx_close() releases it.  -errno, logged. */
int nbdx_prepare(const struct nbdx_config *cfg, struct nbdx **out);
const struct nbdx_config *nbdx_config(const struct nbdx *x);

/* What every libnbd handle nbdferry connects is configured with, in one
 * place: cfg's TLS settings (--tls, --tls-certificates, --tls-psk-file,
 * --tls-username, verification) and, for a URI the user gave, its
 * tls-certificates and tls-psk-file query parameters (local files libnbd
 * refuses by default).  The mount's connections, their reconnections
 * and healing probes, --list and --all-exports all go through it.
 * -1 with the libnbd error set. */
struct nbd_handle;
int nbdx_configure_handle(struct nbd_handle *h,
                          const struct nbdx_config *cfg);

/* Queue op on the least busy connection.  Never blocks and never calls
 * done() itself: done() always runs on an I/O thread. */
void nbdx_submit(struct nbdx *x, struct nbdx_op *op);

/* Submit op and wait for it.  Returns 0 or -errno. */
int nbdx_run(struct nbdx *x, struct nbdx_op *op);

/* Connections opened, and connection i's socket now (-1 while it is
 * reconnecting); opaque is the struct nbdx.  For transport/tcpinfo.h. */
unsigned nbdx_connections(const struct nbdx *x);
int nbdx_conn_fd(void *opaque, unsigned i);

/* Reconnections made so far (any connection).  Bumped before the
 * resends, so a reply seen after a change of this count came from the
 * new server.  The pool reads it to learn that writes acknowledged but
 * not flushed may be lost. */
uint64_t nbdx_reconnects(const struct nbdx *x);

/* TCP_INFO-style counters, for the status. */
struct nbdx_stats {
    uint64_t ops[NBDX_NKINDS];    /* by enum nbdx_kind */
    uint64_t bytes[NBDX_NKINDS];
    uint64_t errors;
};
void nbdx_get_stats(const struct nbdx *x, struct nbdx_stats *out);

/* After the server was given up on (every request fails with EIO, see
 * docs/design/README.md "Servers that stop answering"), try it once more: one
 * fresh connection within --request-timeout, checked against the first
 * one (size, read-only, multi-conn, flush, FUA, block sizes).  When it
 * answers, the connections reconnect on their next request and 0 is
 * returned.  -EIO while the server stays unreachable or changed (one try
 * at a time: callers that waited for a try that failed get -EIO without
 * trying again) and always in
 * the modes that cannot reconnect (--command, --fd, socket activation).
 * Every refusal is logged with the time the server was given up on.
 * 0 at once when nothing was given up on.  Blocks: call it with no lock
 * held. */
int nbdx_heal(struct nbdx *x);
/* Given up on (every request fails until nbdx_heal() finds it again):
 * true from the moment a connection gives up, whoever's request that
 * was (a read-ahead's, the flusher's, a write's).  Any thread. */
bool nbdx_lost(struct nbdx *x);

/* What the status shows about the server's answers (any thread). */
struct nbdx_health {
    double silent_s;          /* with requests outstanding, how long no
                               * connection has moved a byte (0: none is
                               * outstanding); "late" past 1 s.  One
                               * connection that waits while the others
                               * get replies is a slow server, not a
                               * silent one. */
    double worst_s;           /* the longest any one connection with
                               * requests outstanding has moved no byte */
    double fails_in_s;        /* until those requests fail unless the
                               * server answers; -1: nothing waits */
    unsigned outstanding;     /* requests queued or at the server */
    bool stalled;             /* past --request-timeout: new requests wait */
    bool reconnecting;        /* a connection is down and being retried */
    bool lost;                /* given up on: requests fail until healed */
    bool can_heal;            /* this mode can reconnect */
    time_t lost_at, healed_at;/* CLOCK_REALTIME seconds; 0: never */
    unsigned losses, heals;
    char why[200];            /* why it was given up on, or why the last
                               * try to heal failed */
    char retry_why[256];      /* reconnecting: the loss, then the last
                               * try's error ("connection 2 try 3 failed:
                               * connect: Connection refused") */
};
void nbdx_get_health(struct nbdx *x, struct nbdx_health *out);

/* The URI without secrets, for messages: a password in the authority and
 * the values of query parameters whose keys start with "password",
 * "tls-psk" or "secret" become "***".  Writes into buf (len bytes) and
 * returns buf. */
const char *nbdx_redact_uri(const char *uri, char *buf, size_t len);

/* nbds://, nbds+unix:// ...: the URI asks for TLS. */
bool nbdx_uri_is_tls(const char *uri);
/* nbd:// or nbds://: a TCP server with a host name. */
bool nbdx_uri_is_tcp(const char *uri);
/* The percent-decoded value of query parameter key, into val (len
 * bytes).  False if absent or too long. */
bool nbdx_uri_query(const char *uri, const char *key, char *val, size_t len);
/* The export name a URI asks for: its path without the leading "/",
 * percent-decoded, as libnbd sends it ("" for none).  False if it does
 * not fit in len. */
bool nbdx_uri_export(const char *uri, char *val, size_t len);

/* Give up on the server at once: every connection is dropped, every op
 * outstanding or submitted later fails with ENOTCONN, and none
 * reconnects (as when the retry deadline passes, without waiting for
 * it).  For a server that stopped answering before anything was written
 * (the block status scan at mount).  Never blocks. */
void nbdx_abandon(struct nbdx *x);

/* Stop the I/O threads once every op submitted has completed (answered,
 * or failed as any op can: nothing is dropped unanswered), disconnect
 * cleanly and free.  No op may be submitted once this has begun. */
void nbdx_close(struct nbdx *x);
