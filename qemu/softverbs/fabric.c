/*
 * The fabric: the node socket, connections to other nodes, the frame
 * protocol and the progress thread.
 *
 * Frames are a fixed header (struct sv_hdr) and 'len' payload bytes on a
 * unix stream connection. A node sends data frames on a connection it
 * opened to the destination node ($FABRIC/node/<node>/sock); replies
 * (ACK/NAK) go back on the connection the data came in on. Messages to
 * this process travel the same way, through a connection to itself.
 *
 * RC keeps up to SV_RC_WINDOW messages of a QP in flight, numbered from 0
 * since RESET (struct sv_hdr psn). The receiver takes message rcv_nxt
 * only; it drops a later one without a reply (an earlier message was
 * refused, and its sender goes back to it) and answers an earlier one, a
 * copy sent again after a lost connection, with ACK (or adopts it, while
 * the message is still held). Replies come in message order; the sender
 * matches each to its head WQE by the frame id (seq), so replies to frames
 * it has given up on are ignored. Any NAK or a lost connection sends the
 * sender back to its head WQE: every WQE in flight is queued again and
 * goes out after the retry delay. The receiver answers
 *   ACK        message placed in a receive buffer;
 *   NAK RNR    no receive posted (when the sender's rnr_retry is 7 the
 *              receiver instead holds the message until one is posted);
 *   NAK NOT_READY  no such QP, the QP is not receiving, or the sender is
 *              not its connected peer: the sender retries every
 *              transport timeout, retry_cnt times;
 *   NAK NOT_YET    the QP exists and is still in RESET or INIT: its peer
 *              is connecting it. The sender retries every 10 ms for up to
 *              10 s, whatever retry_cnt says: on a loaded host a peer can
 *              take longer than retry_cnt timeouts to reach RTR, and on
 *              one host "not yet connected" is told apart from "gone";
 *   NAK INV_REQ / REM_OP  receive too small / receiver protection error.
 * Failing to resolve the destination GID or to reach the node, or losing
 * the connection while waiting, also counts as a transport retry, so a
 * vanished peer ends in IBV_WC_RETRY_EXC_ERR after retry_cnt timeouts.
 *
 * UD and UC are fire-and-forget: the send completes when the frame is
 * handed to the connection (or dropped because the destination cannot be
 * reached, or its connection has a large backlog). The receiver drops the
 * message when no receive is posted or, for UD, when the Q_Key does not
 * match.
 */
#include "softverbs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum sv_rx { SV_RX_OK, SV_RX_NORECV, SV_RX_LEN, SV_RX_PROT };

/* Frames the progress thread handles per connection before it lets go of
 * the lock (and polls again): a flood must not keep a post call waiting. */
#define SV_THREAD_FRAMES 32

/* Frames a poller handles per connection and call: it came to poll, and
 * its own work (posting receives, say) must not wait behind a flood. */
#define SV_POLL_FRAMES 16

/* ---- connections ---- */

static struct sv_conn *sv_conn_new(int fd, const char *peer)
{
	struct sv_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		close(fd);
		return NULL;
	}
	c->id = ++sv.next_conn_id;
	c->fd = fd;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	sv_list_init(&c->outq);
	sv_list_add_tail(&sv.conns, &c->link);
	return c;
}

static struct sv_conn *sv_conn_by_id(uint64_t id)
{
	struct sv_list *p;

	sv_list_each(p, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		if (c->id == id)
			return c->dead ? NULL : c;
	}
	return NULL;
}

/* The cached connection to a node, or a new one. NULL if unreachable. */
static struct sv_conn *sv_conn_to(const char *node)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct sv_list *p;
	int fd;

	sv_list_each(p, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		if (!c->dead && strcmp(c->peer, node) == 0)
			return c;
	}
	if (snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/node/%s/sock",
		     sv.fabric, node) >= (int)sizeof(addr.sun_path))
		return NULL;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return NULL;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 &&
	    errno != EINPROGRESS) {
		sv_dbg("connect %s: %s\n", node, strerror(errno));
		close(fd);
		return NULL;
	}
	return sv_conn_new(fd, node);
}

/* Writes as much queued output as the socket takes, up to SV_IOV frames
 * per system call. */
static void sv_conn_flush(struct sv_conn *c)
{
	while (!c->dead && !sv_list_empty(&c->outq)) {
		struct iovec iov[2 * SV_IOV];
		struct msghdr msg = { .msg_iov = iov };
		struct sv_list *p;
		size_t k = 0;
		ssize_t n;

		sv_list_each(p, &c->outq) {
			struct sv_out *o = sv_container_of(p, struct sv_out, link);
			size_t plen = o->buf ? o->buf->len : 0;

			if (k + 2 > 2 * SV_IOV)
				break;
			if (o->off < sizeof(o->hdr)) {
				iov[k++] = (struct iovec){ (char *)&o->hdr + o->off,
							   sizeof(o->hdr) - o->off };
				if (plen)
					iov[k++] = (struct iovec){ o->buf->data, plen };
			} else {
				iov[k++] = (struct iovec){
					o->buf->data + (o->off - sizeof(o->hdr)),
					sizeof(o->hdr) + plen - o->off };
			}
		}
		msg.msg_iovlen = k;
		n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				c->dead = 1;
			return;
		}
		c->out_bytes -= (size_t)n;
		while (n > 0) {
			struct sv_out *o = sv_list_first(&c->outq, struct sv_out, link);
			size_t left = sizeof(o->hdr) + (o->buf ? o->buf->len : 0) - o->off;

			if ((size_t)n < left) {
				o->off += (size_t)n;
				return; /* the socket is full */
			}
			n -= (ssize_t)left;
			sv_list_del(&o->link);
			sv_buf_put(o->buf);
			free(o);
		}
	}
}

static void sv_conn_queue(struct sv_conn *c, const struct sv_hdr *h,
			  struct sv_buf *b)
{
	struct sv_out *o = calloc(1, sizeof(*o));

	if (!o) {
		c->dead = 1;
		return;
	}
	o->hdr = *h;
	o->buf = sv_buf_get(b);
	sv_list_add_tail(&c->outq, &o->link);
	c->out_bytes += sizeof(*h) + (b ? b->len : 0);
	/* While the progress thread handles what it read, frames wait for
	 * the end of the batch and leave together. */
	if (!sv.batching)
		sv_conn_flush(c);
}

void sv_send_reply(uint64_t conn_id, uint8_t type, uint8_t syndrome,
		   uint32_t dst_qpn, uint32_t src_qpn, uint64_t seq,
		   uint32_t rnr_timer)
{
	struct sv_conn *c = sv_conn_by_id(conn_id);
	struct sv_hdr h = {
		.magic = SV_MAGIC,
		.type = type,
		.qpt = IBV_QPT_RC,
		.syndrome = syndrome,
		.src_qpn = src_qpn,
		.dst_qpn = dst_qpn,
		.rnr_timer = rnr_timer,
		.seq = seq,
	};

	if (c)
		sv_conn_queue(c, &h, NULL);
}

void sv_held_free(struct sv_held *h)
{
	sv_buf_put(h->data);
	free(h);
}

/* ---- retry timing ---- */

/* RNR NAK timer codes of the IB specification, in microseconds. */
static const uint32_t sv_rnr_us[32] = {
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960,
	1280, 1920, 2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720,
	40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

/* Transport timeout: 4.096 us * 2^timeout, kept within [10 ms, 2 s];
 * 0 (infinite in the specification) uses 1 s. */
static uint64_t sv_timeout_ns(const struct sv_qp *qp)
{
	uint64_t ns;

	if (qp->attr.timeout == 0)
		return 1000000000ull;
	ns = 4096ull << qp->attr.timeout;
	if (ns < 10000000ull)
		ns = 10000000ull;
	if (ns > 2000000000ull)
		ns = 2000000000ull;
	return ns;
}

/* Every WQE in flight goes back to the queue: the next transmission
 * starts again at the head. */
static void sv_rc_rewind(struct sv_qp *qp)
{
	struct sv_list *p;

	sv_list_each(p, &qp->sq) {
		struct sv_swqe *w = sv_container_of(p, struct sv_swqe, link);

		if (w->state != SV_WQE_INFLIGHT)
			break;
		w->state = SV_WQE_QUEUED;
	}
	qp->inflight = 0;
}

/* The head WQE must go again later (and the WQEs in flight behind it); or
 * it fails once its retries are used. */
static void sv_rc_retry(struct sv_qp *qp, struct sv_swqe *w, int rnr,
			uint64_t delay, uint64_t now)
{
	sv_rc_rewind(qp);
	if (rnr) {
		if (qp->attr.rnr_retry != 7 && qp->rnr_left-- <= 0) {
			sv_qp_fail(qp, w, IBV_WC_RNR_RETRY_EXC_ERR);
			return;
		}
	} else if (qp->retry_left-- <= 0) {
		sv_qp_fail(qp, w, IBV_WC_RETRY_EXC_ERR);
		return;
	}
	qp->retry_at = now + delay;
	sv_dbg("rc retry qp %u in %llu us (rnr_left %d retry_left %d)\n", qp->ibv.qp_num,
	       (unsigned long long)(delay / 1000), qp->rnr_left, qp->retry_left);
}

/* ---- receiving ---- */

/*
 * Places a message in the next receive WQE of the QP (its RQ or SRQ) and
 * writes the receive completion. 'grh' (40 bytes, UD) goes first when
 * given. On a local error the QP moves to ERR.
 */
static enum sv_rx sv_rx_deliver(struct sv_qp *qp, uint32_t src_qpn, uint8_t flags,
				uint32_t imm, const uint8_t *grh,
				const struct sv_buf *b)
{
	struct sv_srq *srq = qp->ibv.srq ? to_srq(qp->ibv.srq) : NULL;
	struct ibv_pd *pd = srq ? srq->ibv.pd : qp->ibv.pd;
	uint32_t len = b ? b->len : 0;
	uint64_t need = len + (grh ? SV_GRH_BYTES : 0), room = 0, done = 0;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint8_t *dst[SV_MAX_SGE] = { 0 };
	struct sv_rwqe *r;
	struct ibv_wc wc = { 0 };

	if (srq) {
		r = sv_srq_take(srq);
	} else {
		r = sv_list_first(&qp->rq, struct sv_rwqe, link);
		if (r) {
			sv_list_del(&r->link);
			qp->rq_count--;
		}
	}
	if (!r)
		return SV_RX_NORECV;

	for (int i = 0; i < r->num_sge && st == IBV_WC_SUCCESS; i++) {
		if (r->sge[i].length == 0)
			continue;
		dst[i] = sv_mr_check(pd, &r->sge[i], 1, &st);
		room += r->sge[i].length;
	}
	wc.wr_id = r->wr_id;
	wc.opcode = IBV_WC_RECV;
	wc.qp_num = qp->ibv.qp_num;
	wc.src_qp = src_qpn;
	wc.byte_len = (uint32_t)need;
	if (st == IBV_WC_SUCCESS && room < need)
		st = IBV_WC_LOC_LEN_ERR;
	if (st != IBV_WC_SUCCESS) {
		wc.status = st;
		sv_cq_push(to_cq(qp->ibv.recv_cq), &wc, 1);
		free(r);
		sv_qp_to_error(qp);
		return st == IBV_WC_LOC_LEN_ERR ? SV_RX_LEN : SV_RX_PROT;
	}

	/* scatter: the GRH area first (UD), then the payload */
	for (int i = 0; i < r->num_sge && done < need; i++) {
		uint64_t n = r->sge[i].length, pos = 0;

		if (n == 0)
			continue;
		if (n > need - done)
			n = need - done;
		while (pos < n) {
			uint64_t chunk;
			const uint8_t *src;

			if (grh && done < SV_GRH_BYTES) {
				src = grh + done;
				chunk = SV_GRH_BYTES - done;
			} else {
				uint64_t off = done - (grh ? SV_GRH_BYTES : 0);
				src = b->data + off;
				chunk = len - off;
			}
			if (chunk > n - pos)
				chunk = n - pos;
			memcpy(dst[i] + pos, src, chunk);
			pos += chunk;
			done += chunk;
		}
	}
	wc.status = IBV_WC_SUCCESS;
	if (grh)
		wc.wc_flags |= IBV_WC_GRH;
	if (flags & SV_FL_IMM) {
		wc.wc_flags |= IBV_WC_WITH_IMM;
		wc.imm_data = imm;
	}
	sv_cq_push(to_cq(qp->ibv.recv_cq), &wc, !!(flags & SV_FL_SOLICITED));
	free(r);
	return SV_RX_OK;
}

static void sv_reply_rx(uint64_t conn_id, struct sv_qp *qp, uint32_t src_qpn,
			uint64_t seq, enum sv_rx r)
{
	switch (r) {
	case SV_RX_OK:
		sv_send_reply(conn_id, SV_F_ACK, 0, src_qpn, qp->ibv.qp_num, seq, 0);
		break;
	case SV_RX_LEN:
		sv_send_reply(conn_id, SV_F_NAK, SV_NAK_INV_REQ, src_qpn,
			      qp->ibv.qp_num, seq, 0);
		break;
	case SV_RX_PROT:
		sv_send_reply(conn_id, SV_F_NAK, SV_NAK_REM_OP, src_qpn,
			      qp->ibv.qp_num, seq, 0);
		break;
	case SV_RX_NORECV:
		sv_send_reply(conn_id, SV_F_NAK, SV_NAK_RNR, src_qpn,
			      qp->ibv.qp_num, seq, qp->attr.min_rnr_timer);
		break;
	}
}

/* No receive for an RC message: keep it if the sender asked, else RNR. */
static void sv_rc_hold_or_rnr(struct sv_conn *c, struct sv_qp *qp,
			      const struct sv_hdr *h, struct sv_buf *b)
{
	struct sv_held *held;

	if (!(h->flags & SV_FL_HOLD) || !(held = calloc(1, sizeof(*held)))) {
		sv_reply_rx(c->id, qp, h->src_qpn, h->seq, SV_RX_NORECV);
		return;
	}
	held->conn_id = c->id;
	held->seq = h->seq;
	held->psn = h->psn;
	held->src_qpn = h->src_qpn;
	held->flags = h->flags;
	held->imm = h->imm;
	held->data = sv_buf_get(b);
	sv_list_add_tail(&qp->held, &held->link);
	qp->rcv_nxt++; /* taken: it is placed when a receive comes */
}

/* A message the QP has already taken, sent again after its sender lost
 * the connection the reply was to travel on: ACK it if it was placed;
 * if it is still held, the reply goes to this copy when it is placed. */
static void sv_rc_duplicate(struct sv_conn *c, struct sv_qp *qp,
			    const struct sv_hdr *h)
{
	struct sv_list *p;

	sv_list_each(p, &qp->held) {
		struct sv_held *held = sv_container_of(p, struct sv_held, link);

		if (held->psn == h->psn) {
			held->conn_id = c->id;
			held->seq = h->seq;
			return;
		}
	}
	sv_send_reply(c->id, SV_F_ACK, 0, h->src_qpn, qp->ibv.qp_num, h->seq, 0);
}

/* A connected QP takes messages only from the QP it is connected to
 * (its destination QPN and GID): a stray sender, e.g. one that talked
 * to an earlier process of the same node name, is refused. */
static int sv_from_peer(const struct sv_qp *qp, const struct sv_hdr *h)
{
	return h->src_qpn == qp->attr.dest_qp_num &&
	       memcmp(h->sgid, qp->attr.ah_attr.grh.dgid.raw, 16) == 0;
}

static void sv_rc_rx(struct sv_conn *c, const struct sv_hdr *h, struct sv_buf *b)
{
	struct sv_qp *qp = sv_qp_find(h->dst_qpn);
	enum sv_rx r;

	if (qp && qp->ibv.qp_type == IBV_QPT_RC &&
	    (qp->attr.qp_state == IBV_QPS_RESET || qp->attr.qp_state == IBV_QPS_INIT)) {
		sv_send_reply(c->id, SV_F_NAK, SV_NAK_NOT_YET, h->src_qpn,
			      h->dst_qpn, h->seq, 0);
		return;
	}
	if (!qp || qp->ibv.qp_type != IBV_QPT_RC || !sv_qp_can_receive(qp) ||
	    !sv_from_peer(qp, h)) {
		sv_send_reply(c->id, SV_F_NAK, SV_NAK_NOT_READY, h->src_qpn,
			      h->dst_qpn, h->seq, 0);
		return;
	}
	sv_dbg("rc rx qp %u psn %u seq %llu rcv_nxt %u held %d\n", qp->ibv.qp_num, h->psn,
	       (unsigned long long)h->seq, qp->rcv_nxt, !sv_list_empty(&qp->held));
	if (h->psn != qp->rcv_nxt) {
		if ((int32_t)(h->psn - qp->rcv_nxt) > 0)
			return; /* after a refused one: its sender goes back */
		sv_rc_duplicate(c, qp, h);
		return;
	}
	if (!sv_list_empty(&qp->held)) {
		sv_rc_hold_or_rnr(c, qp, h, b); /* keep the order */
		return;
	}
	r = sv_rx_deliver(qp, h->src_qpn, h->flags, h->imm, NULL, b);
	if (r == SV_RX_NORECV)
		sv_rc_hold_or_rnr(c, qp, h, b);
	else {
		if (r == SV_RX_OK)
			qp->rcv_nxt++;
		sv_reply_rx(c->id, qp, h->src_qpn, h->seq, r);
	}
}

static void sv_unreliable_rx(const struct sv_hdr *h, struct sv_buf *b)
{
	struct sv_qp *qp = sv_qp_find(h->dst_qpn);
	uint8_t grh[SV_GRH_BYTES];

	enum sv_rx r;

	if (!qp || qp->ibv.qp_type != h->qpt) {
		sv_stat_add(SV_ST_DROP_NO_QP, 1);
		return;
	}
	if (!sv_qp_can_receive(qp)) {
		sv_stat_add(SV_ST_DROP_QP_STATE, 1);
		return;
	}
	if (h->qpt == IBV_QPT_UD) {
		if (h->qkey != qp->attr.qkey) {
			sv_stat_add(SV_ST_DROP_QKEY, 1);
			return;
		}
		if (sv_drop_hook())
			return;
		/* an IPv6-style header, as RoCE v1 hardware writes it */
		memset(grh, 0, sizeof(grh));
		grh[0] = 0x60;
		grh[4] = (uint8_t)(h->len >> 8);
		grh[5] = (uint8_t)h->len;
		grh[6] = 0x1b;
		grh[7] = 1;
		memcpy(grh + 8, h->sgid, 16);
		memcpy(grh + 24, h->dgid, 16);
		r = sv_rx_deliver(qp, h->src_qpn, h->flags, h->imm, grh, b);
		if (r == SV_RX_OK)
			sv_stat_add(SV_ST_UD_DELIVERED, 1);
	} else if (sv_from_peer(qp, h)) {
		r = sv_rx_deliver(qp, h->src_qpn, h->flags, h->imm, NULL, b);
	} else {
		sv_stat_add(SV_ST_DROP_NOT_PEER, 1);
		return;
	}
	if (r == SV_RX_NORECV)
		sv_stat_add(SV_ST_DROP_NO_RECV, 1);
}

/* ACK or NAK for the RC send WQE in flight. */
static void sv_reply_in(const struct sv_hdr *h)
{
	struct sv_qp *qp = sv_qp_find(h->dst_qpn);
	struct sv_swqe *w;
	uint64_t now = sv_now_ns();

	if (!qp || qp->ibv.qp_type != IBV_QPT_RC)
		return;
	w = sv_list_first(&qp->sq, struct sv_swqe, link);
	sv_dbg("rc reply qp %u %s syndrome %u seq %llu head seq %llu state %d\n", qp->ibv.qp_num,
	       h->type == SV_F_ACK ? "ACK" : "NAK", h->syndrome, (unsigned long long)h->seq,
	       w ? (unsigned long long)w->seq : 0ull, w ? (int)w->state : -1);
	if (!w || w->state != SV_WQE_INFLIGHT || w->seq != h->seq)
		return; /* stale: the WQE was flushed or the QP reset */
	if (h->type == SV_F_ACK) {
		sv_complete_send(qp, w, IBV_WC_SUCCESS);
		qp->snd_una++;
		qp->inflight--;
		qp->retry_left = qp->attr.retry_cnt;
		qp->rnr_left = qp->attr.rnr_retry;
		qp->retry_at = 0;
		qp->not_yet_until = 0;
		return;
	}
	switch (h->syndrome) {
	case SV_NAK_NOT_YET:
		sv_stat_add(SV_ST_RC_NAK_NOT_YET, 1);
		if (qp->not_yet_until == 0)
			qp->not_yet_until = now + 10000000000ull;
		if (now > qp->not_yet_until) {
			sv_qp_fail(qp, w, IBV_WC_RETRY_EXC_ERR);
			break;
		}
		sv_rc_rewind(qp);
		qp->retry_at = now + 10000000ull;
		break;
	case SV_NAK_RNR:
		sv_stat_add(SV_ST_RC_NAK_RNR, 1);
		sv_rc_retry(qp, w, 1, sv_rnr_us[h->rnr_timer & 31] * 1000ull, now);
		break;
	case SV_NAK_NOT_READY:
		sv_stat_add(SV_ST_RC_NAK_NOT_READY, 1);
		sv_rc_retry(qp, w, 0, sv_timeout_ns(qp), now);
		break;
	case SV_NAK_INV_REQ:
		sv_qp_fail(qp, w, IBV_WC_REM_INV_REQ_ERR);
		break;
	default:
		sv_qp_fail(qp, w, IBV_WC_REM_OP_ERR);
		break;
	}
}

static void sv_frame_in(struct sv_conn *c, const struct sv_hdr *h, struct sv_buf *b)
{
	if (h->type == SV_F_DATA) {
		if (h->qpt == IBV_QPT_RC)
			sv_rc_rx(c, h, b);
		else
			sv_unreliable_rx(h, b);
	} else {
		sv_reply_in(h);
	}
}

/* Takes up to 'want' bytes of the read-ahead buffer into dst. */
static size_t sv_conn_take(struct sv_conn *c, void *dst, size_t want)
{
	size_t n = c->rtail - c->rhead;

	if (n > want)
		n = want;
	memcpy(dst, c->rbuf + c->rhead, n);
	c->rhead += n;
	return n;
}

/*
 * Reads and handles complete frames until the socket is drained (or max
 * frames were handled: the rest stays in the read-ahead buffer, which
 * sv_conn_pending reports). Small frames come out of one read of up to
 * SV_RBUF bytes; a large payload is read straight into its buffer.
 */
static int sv_conn_read(struct sv_conn *c, int max)
{
	int frames = 0;

	if (!c->rbuf && !(c->rbuf = malloc(SV_RBUF))) {
		c->dead = 1;
		return 0;
	}
	while (!c->dead && frames < max) {
		size_t need;
		ssize_t n;

		if (c->in_got < sizeof(c->in_hdr)) {
			c->in_got += sv_conn_take(c, (char *)&c->in_hdr + c->in_got,
						  sizeof(c->in_hdr) - c->in_got);
			if (c->in_got == sizeof(c->in_hdr)) {
				const struct sv_hdr *h = &c->in_hdr;

				if (h->magic != SV_MAGIC || h->type < SV_F_DATA ||
				    h->type > SV_F_NAK || h->len > SV_MAX_MSG) {
					c->dead = 1; /* not one of ours: drop the peer */
					sv_stat_add(SV_ST_BAD_FRAME, 1);
					return frames;
				}
				if (h->len && !(c->in_buf = sv_buf_new(h->len))) {
					c->dead = 1;
					return frames;
				}
			}
		}
		if (c->in_got >= sizeof(c->in_hdr)) {
			size_t off = c->in_got - sizeof(c->in_hdr);

			c->in_got += sv_conn_take(c, c->in_buf ? c->in_buf->data + off : NULL,
						  c->in_hdr.len - off);
			if (c->in_got == sizeof(c->in_hdr) + c->in_hdr.len) {
				struct sv_hdr h = c->in_hdr;
				struct sv_buf *b = c->in_buf;

				c->in_buf = NULL;
				c->in_got = 0;
				sv_frame_in(c, &h, b);
				sv_buf_put(b);
				frames++;
				continue;
			}
		}
		if (c->rhead < c->rtail)
			continue;
		/* The buffer is used up: read more. */
		c->rhead = c->rtail = 0;
		need = c->in_got < sizeof(c->in_hdr) ? 0 :
			sizeof(c->in_hdr) + c->in_hdr.len - c->in_got;
		if (need >= SV_RBUF / 2)
			n = recv(c->fd, c->in_buf->data + (c->in_got - sizeof(c->in_hdr)),
				 need, MSG_DONTWAIT);
		else
			n = recv(c->fd, c->rbuf, SV_RBUF, MSG_DONTWAIT);
		if (n == 0) {
			c->dead = 1;
			return frames;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				c->dead = 1;
			return frames;
		}
		if (need >= SV_RBUF / 2)
			c->in_got += (size_t)n;
		else
			c->rtail = (size_t)n;
	}
	return frames;
}

/* Whether a connection has frames read ahead but not handled yet. */
static int sv_conn_pending(const struct sv_conn *c)
{
	return !c->dead && c->rhead < c->rtail;
}

/* ---- sending ---- */

/*
 * Where a destination GID lives: sv_resolve_gid reads the fabric's GID
 * file, an open and a read per call, too slow for every message. Found
 * routes are kept for SV_ROUTE_NS (a GID that moves to another node is
 * seen that much later; its messages meanwhile are refused and retried)
 * and forgotten when their node cannot be reached.
 */
#define SV_ROUTES 16
#define SV_ROUTE_NS 100000000ull

static struct sv_route {
	union ibv_gid gid;
	char node[128];
	uint64_t until;
} sv_routes[SV_ROUTES];
static unsigned sv_route_next;

static struct sv_route *sv_route(const union ibv_gid *gid, uint64_t now)
{
	struct sv_route *r;

	for (unsigned i = 0; i < SV_ROUTES; i++) {
		r = &sv_routes[i];
		if (r->until > now && memcmp(&r->gid, gid, sizeof(*gid)) == 0)
			return r;
	}
	r = &sv_routes[sv_route_next++ % SV_ROUTES];
	if (sv_resolve_gid(gid, r->node, sizeof(r->node)) != 0) {
		r->until = 0;
		return NULL;
	}
	r->gid = *gid;
	r->until = now + SV_ROUTE_NS;
	return r;
}

/* Whether a GID resolves to a node (after sv_conn_to_gid failed: tells
 * "not registered" from "registered, node unreachable" for the counters). */
static int sv_route_known(const union ibv_gid *gid)
{
	char node[128];

	return sv_resolve_gid(gid, node, sizeof(node)) == 0;
}

/* The connection to the node of a GID, or NULL if it cannot be reached. */
static struct sv_conn *sv_conn_to_gid(const union ibv_gid *gid, uint64_t now)
{
	struct sv_route *r = sv_route(gid, now);
	struct sv_conn *c = r ? sv_conn_to(r->node) : NULL;

	if (r && !c)
		r->until = 0;
	return c;
}

static void sv_fill_hdr(struct sv_hdr *h, const struct sv_qp *qp,
			const struct sv_swqe *w, uint32_t dst_qpn,
			const union ibv_gid *sgid, const union ibv_gid *dgid)
{
	memset(h, 0, sizeof(*h));
	h->magic = SV_MAGIC;
	h->type = SV_F_DATA;
	h->qpt = (uint8_t)qp->ibv.qp_type;
	h->flags = (w->with_imm ? SV_FL_IMM : 0) | (w->solicited ? SV_FL_SOLICITED : 0);
	h->len = w->data->len;
	h->src_qpn = qp->ibv.qp_num;
	h->dst_qpn = dst_qpn;
	h->imm = w->imm;
	memcpy(h->sgid, sgid->raw, 16);
	memcpy(h->dgid, dgid->raw, 16);
}

/* Sends the WQE: 0, or -1 when it could not go (a retry is scheduled, or
 * its retries are used up and it failed: then w and the SQ are gone). */
static int sv_rc_transmit(struct sv_qp *qp, struct sv_swqe *w, uint64_t now)
{
	const union ibv_gid *dgid = &qp->attr.ah_attr.grh.dgid;
	struct sv_conn *c = sv_conn_to_gid(dgid, now);
	struct sv_hdr h;

	if (!c) {
		sv_stat_add(sv_route_known(dgid) ? SV_ST_RC_UNREACHABLE :
			    SV_ST_RC_NO_ROUTE, 1);
		sv_rc_retry(qp, w, 0, sv_timeout_ns(qp), now);
		return -1;
	}
	sv_fill_hdr(&h, qp, w, qp->attr.dest_qp_num, &qp->sgid, dgid);
	if (qp->attr.rnr_retry == 7)
		h.flags |= SV_FL_HOLD;
	h.psn = qp->snd_una + qp->inflight++;
	h.seq = ++sv.next_seq;
	sv_dbg("rc tx qp %u psn %u seq %llu\n", qp->ibv.qp_num, h.psn, (unsigned long long)h.seq);
	w->seq = h.seq;
	w->conn_id = c->id;
	w->state = SV_WQE_INFLIGHT;
	sv_conn_queue(c, &h, w->data);
	return 0;
}

static void sv_unreliable_transmit(struct sv_qp *qp, struct sv_swqe *w)
{
	int ud = qp->ibv.qp_type == IBV_QPT_UD;
	const union ibv_gid *dgid = ud ? &w->dgid : &qp->attr.ah_attr.grh.dgid;
	struct sv_conn *c = sv_conn_to_gid(dgid, sv_now_ns());
	struct sv_hdr h;

	/* a peer that does not read loses datagrams rather than our memory */
	if (c && c->out_bytes < SV_UNRELIABLE_BACKLOG) {
		sv_fill_hdr(&h, qp, w, ud ? w->remote_qpn : qp->attr.dest_qp_num,
			    ud ? &w->sgid : &qp->sgid, dgid);
		h.qkey = w->remote_qkey;
		sv_conn_queue(c, &h, w->data);
		if (ud)
			sv_stat_add(SV_ST_UD_SENT, 1);
	} else if (c) {
		sv_stat_add(SV_ST_DROP_BACKLOG, 1);
	} else {
		sv_stat_add(sv_route_known(dgid) ? SV_ST_DROP_UNREACHABLE :
			    SV_ST_DROP_NO_ROUTE, 1);
	}
	sv_complete_send(qp, w, IBV_WC_SUCCESS);
}

/* Moves a QP's work forward: held messages into new receives, then sends. */
static void sv_service_qp(struct sv_qp *qp, uint64_t now)
{
	struct sv_swqe *w;

	while (sv_qp_can_receive(qp)) {
		struct sv_held *h = sv_list_first(&qp->held, struct sv_held, link);
		enum sv_rx r;

		if (!h)
			break;
		sv_list_del(&h->link); /* off the list: an error flushes the rest */
		r = sv_rx_deliver(qp, h->src_qpn, h->flags, h->imm, NULL, h->data);
		if (r == SV_RX_NORECV) {
			sv_list_add_head(&qp->held, &h->link);
			break;
		}
		sv_reply_rx(h->conn_id, qp, h->src_qpn, h->seq, r);
		sv_held_free(h);
	}

	if (qp->attr.qp_state != IBV_QPS_RTS)
		return;
	if (qp->ibv.qp_type == IBV_QPT_RC) {
		struct sv_list *p;

		if (now < qp->retry_at)
			return;
		/* the queued WQEs after those in flight, while the window has room */
		sv_list_each(p, &qp->sq) {
			w = sv_container_of(p, struct sv_swqe, link);
			if (w->state == SV_WQE_INFLIGHT)
				continue;
			if (qp->inflight >= SV_RC_WINDOW)
				break;
			if (w->err != IBV_WC_SUCCESS) {
				/* fails at the head, after those before it */
				if (qp->inflight == 0)
					sv_qp_fail(qp, w, w->err);
				break;
			}
			if (sv_rc_transmit(qp, w, now) != 0)
				break; /* not sent: retried later, or failed (w is gone) */
		}
		return;
	}
	while (qp->attr.qp_state == IBV_QPS_RTS &&
	       (w = sv_list_first(&qp->sq, struct sv_swqe, link))) {
		if (w->err != IBV_WC_SUCCESS)
			sv_qp_fail(qp, w, w->err);
		else
			sv_unreliable_transmit(qp, w);
	}
}

/* Frees connections that failed. RC WQEs that waited on one retry;
 * messages held from one are forgotten (their sender is gone). */
static void sv_conn_reap(uint64_t now)
{
	struct sv_list *p, *t, *q, *qt;

	sv_list_each_safe(p, t, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		if (!c->dead)
			continue;
		sv_dbg("connection %llu (%s) closed\n", (unsigned long long)c->id,
		       c->peer[0] ? c->peer : "incoming");
		if (!sv.stop)
			sv_stat_add(SV_ST_CONN_LOST, 1);
		sv_list_each(q, &sv.qps) {
			struct sv_qp *qp = sv_container_of(q, struct sv_qp, all);
			struct sv_swqe *w = sv_list_first(&qp->sq, struct sv_swqe, link);
			struct sv_list *hp, *ht;

			struct sv_list *ip;
			int lost = 0;

			sv_list_each(ip, &qp->sq) {
				struct sv_swqe *iw = sv_container_of(ip, struct sv_swqe, link);

				if (iw->state != SV_WQE_INFLIGHT)
					break;
				lost |= iw->conn_id == c->id;
			}
			if (qp->ibv.qp_type == IBV_QPT_RC && lost)
				sv_rc_retry(qp, w, 0, sv_timeout_ns(qp), now);
			/* Held messages from the lost connection are forgotten,
			 * and so are those taken after the first of them (their
			 * senders are told to go back): the QP takes again from
			 * the first one, which its sender, if alive, sends again. */
			lost = 0;
			sv_list_each_safe(hp, ht, &qp->held) {
				struct sv_held *h = sv_container_of(hp, struct sv_held, link);

				if (!lost && h->conn_id != c->id)
					continue;
				if (!lost)
					qp->rcv_nxt = h->psn;
				lost = 1;
				if (h->conn_id != c->id)
					sv_send_reply(h->conn_id, SV_F_NAK, SV_NAK_NOT_READY,
						      h->src_qpn, qp->ibv.qp_num, h->seq, 0);
				sv_list_del(hp);
				sv_held_free(h);
			}
		}
		sv_list_each_safe(q, qt, &c->outq) {
			struct sv_out *o = sv_container_of(q, struct sv_out, link);

			if (o->hdr.type == SV_F_DATA && o->hdr.qpt != IBV_QPT_RC)
				sv_stat_add(SV_ST_DROP_CONN_LOST, 1);
			sv_list_del(q);
			sv_buf_put(o->buf);
			free(o);
		}
		sv_buf_put(c->in_buf);
		free(c->rbuf);
		close(c->fd);
		sv_list_del(&c->link);
		free(c);
	}
}

/* How long the progress thread may sleep: until the earliest RC retry. */
static int sv_next_wait(uint64_t now, struct timespec *ts)
{
	uint64_t best = UINT64_MAX;
	struct sv_list *p;

	sv_list_each(p, &sv.qps) {
		struct sv_qp *qp = sv_container_of(p, struct sv_qp, all);
		struct sv_swqe *w = sv_list_first(&qp->sq, struct sv_swqe, link);

		if (qp->ibv.qp_type == IBV_QPT_RC && w && w->state == SV_WQE_QUEUED &&
		    qp->attr.qp_state == IBV_QPS_RTS && qp->retry_at < best)
			best = qp->retry_at;
	}
	if (best == UINT64_MAX)
		return 0;
	best = best > now ? best - now : 0;
	ts->tv_sec = (time_t)(best / 1000000000ull);
	ts->tv_nsec = (long)(best % 1000000000ull);
	return 1;
}

static void *sv_progress(void *arg)
{
	struct pollfd *pfd = NULL;
	struct sv_conn **pc = NULL;
	size_t cap = 0;

	(void)arg;
	pthread_setname_np(pthread_self(), "softverbs");
	sv_lock();
	while (!sv.stop) {
		uint64_t now = sv_now_ns();
		struct timespec ts;
		struct sv_list *p;
		size_t n = 2;
		int timed;

		sv_list_each(p, &sv.qps)
			sv_service_qp(sv_container_of(p, struct sv_qp, all), now);
		sv_list_each(p, &sv.conns)
			sv_conn_flush(sv_container_of(p, struct sv_conn, link));
		sv_conn_reap(now);

		sv_list_each(p, &sv.conns)
			n++;
		if (n > cap) {
			struct pollfd *np = realloc(pfd, n * sizeof(*pfd));
			struct sv_conn **nc;

			if (np)
				pfd = np;
			nc = realloc(pc, n * sizeof(*pc));
			if (nc)
				pc = nc;
			if (!np || !nc) {
				/* no memory for the poll set: back off briefly */
				sv_unlock();
				usleep(1000);
				sv_lock();
				continue;
			}
			cap = n;
		}
		pfd[0] = (struct pollfd){ .fd = sv.wake_fd, .events = POLLIN };
		pfd[1] = (struct pollfd){ .fd = sv.listen_fd, .events = POLLIN };
		n = 2;
		sv_list_each(p, &sv.conns) {
			struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

			pfd[n] = (struct pollfd){
				.fd = c->fd,
				.events = POLLIN | (sv_list_empty(&c->outq) ? 0 : POLLOUT),
			};
			pc[n++] = c;
		}
		timed = sv_next_wait(now, &ts);
		for (size_t i = 2; i < n; i++) {
			if (sv_conn_pending(pc[i])) {
				/* frames read ahead wait: do not sleep */
				ts = (struct timespec){ 0, 0 };
				timed = 1;
			}
		}

		sv_unlock();
		ppoll(pfd, n, timed ? &ts : NULL, NULL);
		sv_lock();

		if (pfd[0].revents & POLLIN) {
			uint64_t v;
			while (read(sv.wake_fd, &v, sizeof(v)) > 0)
				;
		}
		if (pfd[1].revents & POLLIN) {
			int fd;
			while ((fd = accept4(sv.listen_fd, NULL, NULL,
					     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
				sv_conn_new(fd, "");
		}
		/* Connections are only freed by sv_conn_reap in this thread,
		 * so the pointers in pc stay valid here. The replies to what is
		 * read leave together, at the top of the loop. */
		sv.batching = 1;
		for (size_t i = 2; i < n; i++) {
			if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) ||
			    sv_conn_pending(pc[i]))
				sv_conn_read(pc[i], SV_THREAD_FRAMES);
			if (!pc[i]->dead && (pfd[i].revents & POLLOUT))
				sv_conn_flush(pc[i]);
		}
		sv.batching = 0;
	}
	sv_unlock();
	free(pfd);
	free(pc);
	return NULL;
}

/*
 * Moves a QP's work forward in the calling thread (a post call), so that a
 * send leaves, or a held message is placed, without waking the progress
 * thread: on a busy host each wake-up is a scheduling delay on the path of
 * every message. Returns 1 when the progress thread must look all the same:
 * a connection it does not poll yet, output the socket did not take, a
 * connection that failed, or a head send WQE still waiting (for a retry
 * time, or for the QP to reach RTS).
 */
int sv_service_now(struct sv_qp *qp)
{
	uint64_t conns = sv.next_conn_id;
	struct sv_swqe *w;
	struct sv_list *p;

	sv_service_qp(qp, sv_now_ns());
	if (sv.next_conn_id != conns)
		return 1;
	sv_list_each(p, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		if (c->dead || !sv_list_empty(&c->outq))
			return 1;
	}
	w = sv_list_first(&qp->sq, struct sv_swqe, link);
	return w && w->state == SV_WQE_QUEUED;
}

/*
 * Progress from a thread polling an empty CQ: if nobody holds the lock,
 * read what the connections have (without waiting), move every QP's work
 * forward and send the replies, as the progress thread would. A busy
 * poller then sees a message as soon as it arrives instead of after the
 * progress thread's wake-up. Returns whether a frame was handled; the
 * progress thread is woken when it must look (as after a post call).
 */

int sv_poll_progress(void)
{
	uint64_t conns, now;
	int frames = 0, kick = 0;
	struct sv_list *p;

	if (pthread_mutex_trylock(&sv.lock) != 0)
		return 0;
	if (sv.listen_fd < 0 || sv.stop) {
		sv_unlock();
		return 0;
	}
	conns = sv.next_conn_id;
	sv.batching = 1;
	sv_list_each(p, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		if (!c->dead)
			frames += sv_conn_read(c, SV_POLL_FRAMES);
	}
	sv.batching = 0;
	if (frames) {
		now = sv_now_ns();
		sv_list_each(p, &sv.qps)
			sv_service_qp(sv_container_of(p, struct sv_qp, all), now);
	}
	sv_list_each(p, &sv.conns) {
		struct sv_conn *c = sv_container_of(p, struct sv_conn, link);

		sv_conn_flush(c);
		kick |= c->dead || !sv_list_empty(&c->outq) || sv_conn_pending(c);
	}
	kick |= sv.next_conn_id != conns;
	/* A reply read here may have set a retry time (RNR, NOT_YET,
	 * NOT_READY): the progress thread, asleep with no timeout, must look
	 * again and sleep until it, or the WQE never goes again. */
	if (frames) {
		struct timespec ts;

		kick |= sv_next_wait(sv_now_ns(), &ts);
	}
	sv_unlock();
	if (kick)
		sv_kick();
	return frames > 0;
}

void sv_kick(void)
{
	int fd = __atomic_load_n(&sv.wake_fd, __ATOMIC_ACQUIRE);

	if (fd >= 0)
		sv_event_signal(fd);
}

/* ---- node socket and thread ---- */

/* Binds the node socket. A socket file left by a dead process is
 * replaced; a live node of the same name is an error (EADDRINUSE). */
static int sv_bind_node_socket(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd, probe, alive;

	if (strlen(sv.sock_path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	memcpy(addr.sun_path, sv.sock_path, strlen(sv.sock_path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		if (errno != EADDRINUSE) {
			int e = errno;
			close(fd);
			return -e;
		}
		probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		alive = probe >= 0 &&
			(connect(probe, (struct sockaddr *)&addr, sizeof(addr)) == 0 ||
			 errno == EAGAIN || errno == EINPROGRESS);
		if (probe >= 0)
			close(probe);
		if (alive) {
			close(fd);
			return -EADDRINUSE;
		}
		unlink(sv.sock_path);
		if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
			int e = errno;
			close(fd);
			return -e;
		}
	}
	if (listen(fd, 128) < 0) {
		int e = errno;
		close(fd);
		unlink(sv.sock_path);
		return -e;
	}
	sv.listen_fd = fd;
	return 0;
}

int sv_fabric_start(void)
{
	sigset_t all, old;
	int ret;

	ret = sv_bind_node_socket();
	if (ret)
		return ret;
	memset(sv_routes, 0, sizeof(sv_routes)); /* a new node: nothing known */
	ret = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ret < 0) {
		ret = -errno;
		goto err;
	}
	__atomic_store_n(&sv.wake_fd, ret, __ATOMIC_RELEASE);
	sv.stop = 0;
	/* The thread blocks all signals: they belong to the application. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&sv.thread, NULL, sv_progress, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		goto err;
	return 0;
err:
	if (sv.wake_fd >= 0)
		close(sv.wake_fd);
	__atomic_store_n(&sv.wake_fd, -1, __ATOMIC_RELEASE);
	close(sv.listen_fd);
	sv.listen_fd = -1;
	unlink(sv.sock_path);
	return ret;
}

void sv_fabric_stop(void)
{
	struct sv_list *p;

	sv.stop = 1;
	sv_kick();
	sv_unlock();
	pthread_join(sv.thread, NULL);
	sv_lock();
	sv_list_each(p, &sv.conns)
		sv_container_of(p, struct sv_conn, link)->dead = 1;
	sv_conn_reap(sv_now_ns());
	close(sv.listen_fd);
	sv.listen_fd = -1;
	unlink(sv.sock_path);
	close(sv.wake_fd);
	__atomic_store_n(&sv.wake_fd, -1, __ATOMIC_RELEASE);
}
