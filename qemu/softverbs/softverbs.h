/*
 * softverbs: a small software RDMA HCA behind the libibverbs API.
 *
 * This header holds the internal types shared by the library's source
 * files. The public API is the one of <infiniband/verbs.h>; the library
 * replaces libibverbs.so.1 through LD_LIBRARY_PATH.
 *
 * Model: one process is one node of a "fabric" (a directory). A node owns
 * one listening unix socket; frames between nodes travel over cached
 * unix stream connections. A single progress thread per process moves
 * frames, matches receives, and writes completions.
 *
 * Locking: one process-wide mutex (sv.lock) protects every object and
 * queue below. Verbs calls take it for their whole duration; the progress
 * thread holds it except while it sleeps in poll(2). Nothing blocks while
 * holding it: sockets are non-blocking and event fds are only read
 * outside it.
 */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H

/* the ABI every libibverbs.so.1 of the project exports: verbs.h, its
 * macros undone, ABI_EXPORT */
#include "../../verbsabi/abi.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SV_EXPORT ABI_EXPORT

/* ---- device limits (what ibv_query_device/ibv_query_port report) ---- */

#define SV_DEV_NAME "softverbs0"
#define SV_PORT 1
#define SV_GID_TBL_LEN 256
#define SV_MAX_SGE 4
#define SV_RC_WINDOW 64 /* RC messages a QP may have in flight */
#define SV_MAX_QP 1024
#define SV_MAX_QP_WR 16384
#define SV_MAX_CQ 2048
#define SV_MAX_CQE 65536
#define SV_MAX_MR 1024
#define SV_MAX_PD 1024
#define SV_MAX_AH 1024
#define SV_MAX_SRQ 512
#define SV_MAX_SRQ_WR 16384
#define SV_MAX_RD_ATOM 16
#define SV_MAX_INLINE 512
#define SV_MAX_MR_SIZE (1ull << 30)
#define SV_MAX_MSG (16u << 20)   /* largest RC/UC message */
#define SV_MTU IBV_MTU_4096
#define SV_MTU_BYTES 4096u       /* largest UD payload */
#define SV_GRH_BYTES 40u
#define SV_UNRELIABLE_BACKLOG (16u << 20) /* UD/UC frames are dropped beyond this */

/* gid type values of the private libibverbs enum ibv_gid_type_sysfs */
#define SV_GID_TYPE_ROCE_V1 0

/* ---- tiny intrusive doubly linked list ---- */

struct sv_list {
	struct sv_list *prev, *next;
};

static inline void sv_list_init(struct sv_list *l) { l->prev = l->next = l; }
static inline int sv_list_empty(const struct sv_list *l) { return l->next == l; }

static inline void sv_list_add_tail(struct sv_list *head, struct sv_list *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}

static inline void sv_list_add_head(struct sv_list *head, struct sv_list *n)
{
	sv_list_add_tail(head->next, n);
}

static inline void sv_list_del(struct sv_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	n->prev = n->next = n;
}

#define sv_container_of(p, type, member) \
	((type *)((char *)(p) - offsetof(type, member)))
#define sv_list_first(head, type, member) \
	(sv_list_empty(head) ? NULL : sv_container_of((head)->next, type, member))
#define sv_list_each(pos, head) \
	for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)
#define sv_list_each_safe(pos, tmp, head) \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); \
	     (pos) = (tmp), (tmp) = (pos)->next)

/* ---- objects ---- */

/* A reference-counted byte buffer: message payloads shared between a send
 * WQE (kept for retransmission) and the frames queued on a connection. */
struct sv_buf {
	int refs;
	uint32_t len;
	uint8_t data[];
};

struct sv_context {
	struct ibv_context ibv;
	struct sv_list link;          /* in sv.contexts */
	struct sv_list pds, mrs, cqs, qps, srqs, ahs, channels;
	int n_pd, n_mr, n_cq, n_qp, n_srq, n_ah;
	struct sv_list async_events;  /* struct sv_async_event */
};

struct sv_async_event {
	struct sv_list link;
	struct ibv_async_event ev;
};

struct sv_pd {
	struct ibv_pd ibv;
	struct sv_list link;
	int refs;                     /* MRs, QPs, SRQs, AHs using it */
};

struct sv_mr {
	struct ibv_mr ibv;
	struct sv_list link;          /* in context */
	struct sv_list hlink;         /* in sv.mr_hash */
	uint64_t iova;                /* address the SGEs use */
	int access;
};

struct sv_ah {
	struct ibv_ah ibv;
	struct sv_list link;
	union ibv_gid dgid, sgid;
};

struct sv_channel {
	struct ibv_comp_channel ibv;
	struct sv_list link;
	struct sv_list events;        /* struct sv_cq_event, oldest first */
	int refs;                     /* CQs using it */
};

struct sv_cq_event {
	struct sv_list link;
	struct sv_cq *cq;
};

enum { SV_ARM_NONE, SV_ARM_SOLICITED, SV_ARM_ANY };

struct sv_cq {
	struct ibv_cq ibv;
	struct sv_list link;
	struct ibv_wc *ring;          /* grows on demand: never drops a CQE */
	uint32_t cap, head, count;
	int armed;
	int refs;                     /* QPs using it */
	uint32_t events_reported;     /* events ibv_get_cq_event handed out */
	int zombie;                   /* destroyed; freed by the last ack */
};

/* A receive WQE (RQ or SRQ). */
struct sv_rwqe {
	struct sv_list link;
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_srq {
	struct ibv_srq ibv;
	struct sv_list link;
	struct sv_list wqes;
	uint32_t count, max_wr, max_sge, limit;
	int refs;                     /* QPs attached */
};

enum sv_swqe_state { SV_WQE_QUEUED, SV_WQE_INFLIGHT };

/* A send WQE. The payload is gathered at post time. */
struct sv_swqe {
	struct sv_list link;
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	int signaled, solicited, with_imm;
	uint32_t imm;                 /* network order, as posted */
	enum ibv_wc_status err;       /* != SUCCESS: fails when it reaches the head */
	struct sv_buf *data;
	enum sv_swqe_state state;
	uint64_t seq;                 /* RC: id of the frame in flight */
	uint64_t conn_id;             /* RC: connection it went out on */
	/* UD destination, copied from the AH and the WR */
	union ibv_gid dgid, sgid;
	uint32_t remote_qpn, remote_qkey;
};

/* An RC message the receiver holds because no receive was posted
 * (the sender asked for infinite RNR retry). */
struct sv_held {
	struct sv_list link;
	uint64_t conn_id;
	uint64_t seq;
	uint32_t psn;
	uint32_t src_qpn;
	uint8_t flags;
	uint32_t imm;
	struct sv_buf *data;
};

struct sv_qp {
	struct ibv_qp ibv;
	struct sv_list link;          /* in context */
	struct sv_list hlink;         /* in sv.qp_hash */
	struct sv_list all;           /* in sv.qps (progress thread walks it) */
	struct ibv_qp_attr attr;      /* current attributes */
	struct ibv_qp_cap cap;
	int sq_sig_all;
	union ibv_gid sgid;           /* connected QPs: source GID at RTR */
	struct sv_list sq;            /* struct sv_swqe, post order */
	struct sv_list rq;            /* struct sv_rwqe */
	struct sv_list held;          /* struct sv_held */
	uint32_t sq_count, rq_count;
	uint64_t retry_at;            /* RC: monotonic ns before which the head waits */
	int retry_left, rnr_left;
	uint64_t not_yet_until; /* while the peer QP is still connecting: give up after this */
	/* RC message numbers (counted from 0 since RESET; not the IB PSNs):
	 * the sender's head WQE is message snd_una and 'inflight' WQEs after
	 * it are on the wire; the receiver takes message rcv_nxt next. */
	uint32_t snd_una, inflight, rcv_nxt;
};

/* ---- wire format between nodes ---- */

#define SV_MAGIC 0x53564632u /* "SVF2" */

enum sv_frame_type { SV_F_DATA = 1, SV_F_ACK = 2, SV_F_NAK = 3 };

enum sv_frame_flags {
	SV_FL_IMM = 1,        /* imm carries immediate data */
	SV_FL_SOLICITED = 2,
	SV_FL_HOLD = 4,       /* RC: receiver holds the message until a receive is posted */
};

enum sv_nak {
	SV_NAK_RNR = 1,       /* no receive posted; rnr_timer says how long to wait */
	SV_NAK_NOT_READY,     /* no such QP, or not able to receive: transport retry */
	SV_NAK_NOT_YET,       /* the QP exists and is still being connected (RESET/INIT) */
	SV_NAK_INV_REQ,       /* receive too small */
	SV_NAK_REM_OP,        /* receiver failed locally (e.g. protection error) */
};

struct sv_hdr {
	uint32_t magic;
	uint8_t type;         /* enum sv_frame_type */
	uint8_t qpt;          /* enum ibv_qp_type of the sender */
	uint8_t flags;        /* enum sv_frame_flags */
	uint8_t syndrome;     /* NAK: enum sv_nak */
	uint32_t len;         /* payload bytes after the header */
	uint32_t src_qpn, dst_qpn;
	uint32_t qkey;
	uint32_t imm;
	uint32_t rnr_timer;   /* NAK RNR: receiver's min_rnr_timer code */
	uint32_t psn;         /* RC data: the message's number on its QP */
	uint64_t seq;
	uint8_t sgid[16], dgid[16];
};

struct sv_out {
	struct sv_list link;
	struct sv_hdr hdr;
	struct sv_buf *buf;   /* may be NULL */
	size_t off;           /* bytes of hdr+payload already written */
};

struct sv_conn {
	struct sv_list link;
	uint64_t id;
	int fd;
	int dead;
	char peer[128];       /* outgoing: the node it leads to; incoming: "" */
	struct sv_list outq;  /* struct sv_out */
	size_t out_bytes;     /* queued, not yet written */
	struct sv_hdr in_hdr;
	size_t in_got;
	struct sv_buf *in_buf;
	uint8_t *rbuf;        /* bytes read ahead: rbuf[rhead, rtail) */
	size_t rhead, rtail;
};

#define SV_RBUF 65536
#define SV_IOV 64             /* frames gathered into one sendmsg */

/* ---- process-wide state ---- */

#define SV_HASH 256

struct sv_state {
	pthread_mutex_t lock;
	int refs;                     /* open contexts */
	struct sv_list contexts;
	char node[128];
	char fabric[512];
	char node_dir[700];
	char sock_path[800];
	union ibv_gid gid1;           /* this node's default GID */
	int listen_fd, wake_fd;
	pthread_t thread;
	int stop;
	struct sv_list conns;
	struct sv_list qps;
	struct sv_list qp_hash[SV_HASH];
	struct sv_list mr_hash[SV_HASH];
	uint32_t next_qpn, next_key;
	uint64_t next_seq, next_conn_id;
	int batching;                 /* progress thread: replies wait for the batch's end */
	int debug;
	int no_poll_progress;         /* SOFTVERBS_POLL_PROGRESS=0 */
};

extern struct sv_state sv;

#define sv_lock() pthread_mutex_lock(&sv.lock)
#define sv_unlock() pthread_mutex_unlock(&sv.lock)

#define sv_dbg(...) \
	do { \
		if (sv.debug) \
			fprintf(stderr, "softverbs: " __VA_ARGS__); \
	} while (0)

#define to_ctx(c) sv_container_of(c, struct sv_context, ibv)
#define to_pd(p) sv_container_of(p, struct sv_pd, ibv)
#define to_mr(m) sv_container_of(m, struct sv_mr, ibv)
#define to_cq(c) sv_container_of(c, struct sv_cq, ibv)
#define to_qp(q) sv_container_of(q, struct sv_qp, ibv)
#define to_srq(s) sv_container_of(s, struct sv_srq, ibv)
#define to_ah(a) sv_container_of(a, struct sv_ah, ibv)
#define to_channel(c) sv_container_of(c, struct sv_channel, ibv)

/* ---- stats.c ---- */
enum sv_stat {
	SV_ST_UD_SENT,          /* UD datagrams handed to a connection */
	SV_ST_UD_DELIVERED,     /* UD datagrams placed in a receive */
	SV_ST_DROP_NO_ROUTE,    /* sender: destination GID not registered */
	SV_ST_DROP_UNREACHABLE, /* sender: the destination node did not answer */
	SV_ST_DROP_BACKLOG,     /* sender: the connection held too much */
	SV_ST_DROP_CONN_LOST,   /* UD/UC frames queued on a connection that died */
	SV_ST_DROP_NO_QP,       /* receiver: no such QP, or another type */
	SV_ST_DROP_QP_STATE,    /* receiver: the QP is not receiving (RESET/INIT/ERR) */
	SV_ST_DROP_QKEY,        /* receiver: Q_Key mismatch */
	SV_ST_DROP_NOT_PEER,    /* receiver: UC from a QP it is not connected to */
	SV_ST_DROP_NO_RECV,     /* receiver: no receive posted */
	SV_ST_DROP_INJECTED,    /* receiver: SOFTVERBS_DROP_UD */
	SV_ST_BAD_FRAME,        /* connections dropped for a malformed frame */
	SV_ST_CONN_LOST,        /* connections that failed */
	SV_ST_RC_NAK_RNR,       /* RC: RNR NAKs received */
	SV_ST_RC_NAK_NOT_READY, /* RC: NOT_READY NAKs received */
	SV_ST_RC_NAK_NOT_YET,   /* RC: NOT_YET NAKs received */
	SV_ST_RC_FAILED,        /* RC: send WQEs completed in error */
	SV_ST_RC_NO_ROUTE,      /* RC: a send found its destination GID unregistered (retried) */
	SV_ST_RC_UNREACHABLE,   /* RC: a send found the destination node unreachable (retried) */
	SV_ST_COUNT
};
void sv_stat_add(enum sv_stat s, uint64_t n);
void sv_stats_open(void);   /* called locked, when the node comes up */
void sv_stats_forget(void); /* in a forked child */
int sv_drop_hook(void);     /* 1: drop this UD datagram (test hook) */

/* ---- util.c ---- */
uint64_t sv_now_ns(void);
struct sv_buf *sv_buf_new(uint32_t len);
void sv_buf_put(struct sv_buf *b);
static inline struct sv_buf *sv_buf_get(struct sv_buf *b) { if (b) b->refs++; return b; }
int sv_valid_node_name(const char *s);
void sv_gid_hex(const union ibv_gid *gid, char out[33]);
int sv_gid_parse(const char *hex, union ibv_gid *gid);
int sv_gid_is_zero(const union ibv_gid *gid);
int sv_write_file_atomic(const char *path, const char *text);
int sv_mkdirs(const char *path);
void sv_event_signal(int fd);
void sv_event_consume(int fd);

/* ---- device.c ---- */
int sv_node_acquire(void);    /* called locked */
void sv_node_release(void);   /* called locked; may drop and retake the lock */
void sv_node_gid1(const char *node, union ibv_gid *gid);
int sv_query_gid_locked(int index, union ibv_gid *gid);
int sv_resolve_gid(const union ibv_gid *gid, char *node, size_t len);
void sv_async_push(struct sv_context *ctx, const struct ibv_async_event *ev);
void sv_async_purge(struct sv_context *ctx, const void *obj);

/* ---- mr.c ---- */
struct sv_mr *sv_mr_find(uint32_t lkey);
void *sv_mr_check(struct ibv_pd *pd, const struct ibv_sge *sge, int need_write,
		  enum ibv_wc_status *st);
void sv_pd_free(struct sv_pd *pd);
void sv_mr_free(struct sv_mr *mr);
void sv_ah_free(struct sv_ah *ah);

/* ---- cq.c ---- */
void sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc, int solicited);
void sv_cq_purge_qp(struct sv_cq *cq, uint32_t qp_num);
void sv_cq_free(struct sv_cq *cq);
void sv_channel_free(struct sv_channel *ch);
int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);

/* ---- srq.c ---- */
struct sv_rwqe *sv_srq_take(struct sv_srq *srq);
void sv_srq_free(struct sv_srq *srq);
int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad);

/* ---- qp.c ---- */
struct sv_qp *sv_qp_find(uint32_t qpn);
void sv_qp_fail(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status st);
void sv_qp_to_error(struct sv_qp *qp);
void sv_complete_send(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status st);
void sv_qp_free(struct sv_qp *qp);
int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int sv_rwqe_new(const struct ibv_recv_wr *wr, uint32_t max_sge, uint32_t count,
		uint32_t max_wr, struct sv_rwqe **out);
int sv_qp_can_receive(const struct sv_qp *qp);

/* ---- fabric.c (progress thread, connections, frames) ---- */
int sv_fabric_start(void);    /* called locked */
void sv_fabric_stop(void);    /* called locked; drops the lock while joining */
void sv_kick(void);           /* wake the progress thread */
int sv_service_now(struct sv_qp *qp); /* called locked; 1: the thread must look */
int sv_poll_progress(void);   /* called unlocked, from an empty poll */
void sv_held_free(struct sv_held *h);
void sv_send_reply(uint64_t conn_id, uint8_t type, uint8_t syndrome,
		   uint32_t dst_qpn, uint32_t src_qpn, uint64_t seq,
		   uint32_t rnr_timer);

#endif
