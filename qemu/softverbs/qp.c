/*
 * Queue pairs: creation, the state machine, posting work requests, and
 * completing them.
 *
 * Every WQE that a post call accepts completes exactly once: on success
 * (send WQEs only if signaled), with an error status, or with
 * IBV_WC_WR_FLUSH_ERR when the QP goes to the error state. Only moving
 * the QP to RESET or destroying it discards WQEs without completions
 * (and removes the QP's completions still queued in its CQs).
 */
#include "softverbs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static unsigned sv_qpn_hash(uint32_t qpn) { return qpn % SV_HASH; }

struct sv_qp *sv_qp_find(uint32_t qpn)
{
	struct sv_list *p;

	sv_list_each(p, &sv.qp_hash[sv_qpn_hash(qpn)]) {
		struct sv_qp *qp = sv_container_of(p, struct sv_qp, hlink);

		if (qp->ibv.qp_num == qpn)
			return qp;
	}
	return NULL;
}

/* Receives are matched in RTR and later, up to (not including) ERR. */
int sv_qp_can_receive(const struct sv_qp *qp)
{
	switch (qp->attr.qp_state) {
	case IBV_QPS_RTR:
	case IBV_QPS_RTS:
	case IBV_QPS_SQD:
	case IBV_QPS_SQE:
		return 1;
	default:
		return 0;
	}
}

static void sv_qp_set_state(struct sv_qp *qp, enum ibv_qp_state s)
{
	qp->attr.qp_state = s;
	qp->attr.cur_qp_state = s;
	qp->ibv.state = s;
}

/* ---- create ---- */

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd,
				       struct ibv_qp_init_attr *init)
{
	struct sv_context *ctx;
	struct sv_qp *qp;
	struct ibv_qp_cap cap;

	if (!pd || !init || !init->send_cq || !init->recv_cq) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(pd->context);
	if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC &&
	    init->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (init->send_cq->context != pd->context ||
	    init->recv_cq->context != pd->context ||
	    (init->srq && init->srq->context != pd->context)) {
		errno = EINVAL;
		return NULL;
	}
	cap = init->cap;
	if (init->srq) {
		cap.max_recv_wr = 0;
		cap.max_recv_sge = 0;
	}
	if (cap.max_send_wr > SV_MAX_QP_WR || cap.max_recv_wr > SV_MAX_QP_WR ||
	    cap.max_send_sge > SV_MAX_SGE || cap.max_recv_sge > SV_MAX_SGE ||
	    cap.max_inline_data > SV_MAX_INLINE) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->ibv.context = pd->context;
	qp->ibv.qp_context = init->qp_context;
	qp->ibv.pd = pd;
	qp->ibv.send_cq = init->send_cq;
	qp->ibv.recv_cq = init->recv_cq;
	qp->ibv.srq = init->srq;
	qp->ibv.qp_type = init->qp_type;
	pthread_mutex_init(&qp->ibv.mutex, NULL);
	pthread_cond_init(&qp->ibv.cond, NULL);
	qp->cap = cap;
	qp->sq_sig_all = init->sq_sig_all;
	sv_list_init(&qp->sq);
	sv_list_init(&qp->rq);
	sv_list_init(&qp->held);
	sv_qp_set_state(qp, IBV_QPS_RESET);

	sv_lock();
	if (ctx->n_qp >= SV_MAX_QP) {
		sv_unlock();
		free(qp);
		errno = ENOMEM;
		return NULL;
	}
	/* QPNs are unique in the node and stay below 0x10000. */
	do {
		qp->ibv.qp_num = sv.next_qpn++;
		if (sv.next_qpn > 0xffff)
			sv.next_qpn = 0x10;
	} while (sv_qp_find(qp->ibv.qp_num));
	qp->ibv.handle = qp->ibv.qp_num;
	sv_list_add_tail(&sv.qp_hash[sv_qpn_hash(qp->ibv.qp_num)], &qp->hlink);
	sv_list_add_tail(&sv.qps, &qp->all);
	sv_list_add_tail(&ctx->qps, &qp->link);
	ctx->n_qp++;
	to_pd(pd)->refs++;
	to_cq(init->send_cq)->refs++;
	to_cq(init->recv_cq)->refs++;
	if (init->srq)
		to_srq(init->srq)->refs++;
	sv_unlock();
	init->cap = cap;
	return &qp->ibv;
}

SV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp; /* the extended send API is not provided */
	errno = EOPNOTSUPP;
	return NULL;
}

/* ---- completing work ---- */

static void sv_free_swqe(struct sv_swqe *w)
{
	sv_buf_put(w->data);
	free(w);
}

/* Completes a send WQE (removing it from the SQ). Successful unsignaled
 * WQEs produce no CQE; errors always do. */
void sv_complete_send(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status st)
{
	sv_list_del(&w->link);
	qp->sq_count--;
	if (st != IBV_WC_SUCCESS || w->signaled || qp->sq_sig_all) {
		struct ibv_wc wc = {
			.wr_id = w->wr_id,
			.status = st,
			.opcode = IBV_WC_SEND,
			.byte_len = w->data ? w->data->len : 0,
			.qp_num = qp->ibv.qp_num,
		};
		sv_cq_push(to_cq(qp->ibv.send_cq), &wc, 0);
	}
	sv_free_swqe(w);
}

static void sv_flush_recv(struct sv_qp *qp, struct sv_rwqe *r)
{
	struct ibv_wc wc = {
		.wr_id = r->wr_id,
		.status = IBV_WC_WR_FLUSH_ERR,
		.opcode = IBV_WC_RECV,
		.qp_num = qp->ibv.qp_num,
	};

	sv_cq_push(to_cq(qp->ibv.recv_cq), &wc, 0);
	free(r);
}

static void sv_flush_sq(struct sv_qp *qp)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &qp->sq)
		sv_complete_send(qp, sv_container_of(p, struct sv_swqe, link),
				 IBV_WC_WR_FLUSH_ERR);
	qp->inflight = 0;
}

static void sv_flush_rq(struct sv_qp *qp)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &qp->rq) {
		sv_list_del(p);
		qp->rq_count--;
		sv_flush_recv(qp, sv_container_of(p, struct sv_rwqe, link));
	}
}

/* Refuses the messages the QP holds: their senders retry and give up. */
static void sv_drop_held(struct sv_qp *qp)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &qp->held) {
		struct sv_held *h = sv_container_of(p, struct sv_held, link);

		sv_send_reply(h->conn_id, SV_F_NAK, SV_NAK_NOT_READY, h->src_qpn,
			      qp->ibv.qp_num, h->seq, 0);
		sv_list_del(p);
		sv_held_free(h);
	}
}

/* Moves the QP to ERR and flushes all its outstanding WQEs. */
void sv_qp_to_error(struct sv_qp *qp)
{
	if (qp->attr.qp_state == IBV_QPS_ERR)
		return;
	sv_qp_set_state(qp, IBV_QPS_ERR);
	sv_flush_sq(qp);
	sv_flush_rq(qp);
	sv_drop_held(qp);
	if (qp->ibv.srq) {
		struct ibv_async_event ev = {
			.element.qp = &qp->ibv,
			.event_type = IBV_EVENT_QP_LAST_WQE_REACHED,
		};
		sv_async_push(to_ctx(qp->ibv.context), &ev);
	}
}

/* A send WQE failed: complete it with st, then the QP leaves service.
 * UD and UC QPs go to SQE (send queue error, receives go on); RC to ERR. */
void sv_qp_fail(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status st)
{
	sv_complete_send(qp, w, st);
	if (qp->ibv.qp_type == IBV_QPT_RC) {
		sv_stat_add(SV_ST_RC_FAILED, 1);
		sv_qp_to_error(qp);
	} else if (qp->attr.qp_state != IBV_QPS_ERR) {
		sv_qp_set_state(qp, IBV_QPS_SQE);
		sv_flush_sq(qp);
	}
}

/* Back to RESET: discard everything without completions. */
static void sv_qp_reset(struct sv_qp *qp)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &qp->sq) {
		sv_list_del(p);
		sv_free_swqe(sv_container_of(p, struct sv_swqe, link));
	}
	sv_list_each_safe(p, t, &qp->rq) {
		sv_list_del(p);
		free(sv_container_of(p, struct sv_rwqe, link));
	}
	qp->sq_count = qp->rq_count = 0;
	sv_drop_held(qp);
	sv_cq_purge_qp(to_cq(qp->ibv.send_cq), qp->ibv.qp_num);
	sv_cq_purge_qp(to_cq(qp->ibv.recv_cq), qp->ibv.qp_num);
	memset(&qp->attr, 0, sizeof(qp->attr));
	memset(&qp->sgid, 0, sizeof(qp->sgid));
	qp->retry_at = 0;
	qp->retry_left = qp->rnr_left = 0;
	qp->snd_una = qp->inflight = qp->rcv_nxt = 0;
	sv_qp_set_state(qp, IBV_QPS_RESET);
}

/* ---- modify ---- */

#define M(x) IBV_QP_##x

/* The attributes each transition requires and allows, per QP type (the
 * IB specification's QP state table). Returns -1 for an illegal move. */
static int sv_qp_trans(enum ibv_qp_type t, enum ibv_qp_state cur,
		       enum ibv_qp_state nxt, int *req, int *opt)
{
	int rc = t == IBV_QPT_RC, ud = t == IBV_QPT_UD;
	int rts_opt = M(CUR_STATE) |
		      (ud ? M(QKEY) : M(ACCESS_FLAGS) | M(ALT_PATH) | M(PATH_MIG_STATE) |
				      (rc ? M(MIN_RNR_TIMER) : 0));

	*req = *opt = 0;
	if (nxt == IBV_QPS_RESET || nxt == IBV_QPS_ERR)
		return 0;
	switch (cur) {
	case IBV_QPS_RESET:
		if (nxt != IBV_QPS_INIT)
			break;
		*req = M(PKEY_INDEX) | M(PORT) | (ud ? M(QKEY) : M(ACCESS_FLAGS));
		return 0;
	case IBV_QPS_INIT:
		if (nxt == IBV_QPS_INIT) {
			*opt = M(PKEY_INDEX) | M(PORT) | (ud ? M(QKEY) : M(ACCESS_FLAGS));
			return 0;
		}
		if (nxt != IBV_QPS_RTR)
			break;
		if (ud) {
			*opt = M(PKEY_INDEX) | M(QKEY);
		} else {
			*req = M(AV) | M(PATH_MTU) | M(DEST_QPN) | M(RQ_PSN) |
			       (rc ? M(MAX_DEST_RD_ATOMIC) | M(MIN_RNR_TIMER) : 0);
			*opt = M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX);
		}
		return 0;
	case IBV_QPS_RTR:
		if (nxt != IBV_QPS_RTS)
			break;
		*req = M(SQ_PSN) | (rc ? M(TIMEOUT) | M(RETRY_CNT) | M(RNR_RETRY) |
					      M(MAX_QP_RD_ATOMIC) : 0);
		*opt = rts_opt;
		return 0;
	case IBV_QPS_RTS:
		if (nxt == IBV_QPS_RTS) {
			*opt = rts_opt;
			return 0;
		}
		if (nxt == IBV_QPS_SQD) {
			*opt = M(EN_SQD_ASYNC_NOTIFY);
			return 0;
		}
		break;
	case IBV_QPS_SQD:
		if (nxt == IBV_QPS_RTS) {
			*opt = rts_opt;
			return 0;
		}
		if (nxt != IBV_QPS_SQD)
			break;
		if (ud)
			*opt = M(PKEY_INDEX) | M(QKEY);
		else if (!rc)
			*opt = M(AV) | M(ALT_PATH) | M(ACCESS_FLAGS) | M(PKEY_INDEX) |
			       M(PATH_MIG_STATE);
		else
			*opt = M(PORT) | M(AV) | M(TIMEOUT) | M(RETRY_CNT) |
			       M(RNR_RETRY) | M(MAX_QP_RD_ATOMIC) |
			       M(MAX_DEST_RD_ATOMIC) | M(ALT_PATH) | M(ACCESS_FLAGS) |
			       M(PKEY_INDEX) | M(MIN_RNR_TIMER) | M(PATH_MIG_STATE);
		return 0;
	case IBV_QPS_SQE:
		if (nxt == IBV_QPS_RTS && !rc) {
			*opt = M(CUR_STATE) | (ud ? M(QKEY) : M(ACCESS_FLAGS));
			return 0;
		}
		break;
	default:
		break;
	}
	return -1;
}

/* Checks the values of the attributes present in mask. */
static int sv_qp_check_values(struct ibv_qp_attr *a, int mask, union ibv_gid *sgid)
{
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

	if ((mask & M(PORT)) && a->port_num != SV_PORT)
		return EINVAL;
	if ((mask & M(PKEY_INDEX)) && a->pkey_index != 0)
		return EINVAL;
	if ((mask & M(ACCESS_FLAGS)) && (a->qp_access_flags & ~access))
		return EINVAL;
	if ((mask & M(PATH_MTU)) &&
	    (a->path_mtu < IBV_MTU_256 || a->path_mtu > SV_MTU))
		return EINVAL;
	if ((mask & M(MAX_QP_RD_ATOMIC)) && a->max_rd_atomic > SV_MAX_RD_ATOM)
		return EINVAL;
	if ((mask & M(MAX_DEST_RD_ATOMIC)) && a->max_dest_rd_atomic > SV_MAX_RD_ATOM)
		return EINVAL;
	if ((mask & M(MIN_RNR_TIMER)) && a->min_rnr_timer > 31)
		return EINVAL;
	if ((mask & M(TIMEOUT)) && a->timeout > 31)
		return EINVAL;
	if ((mask & M(RETRY_CNT)) && a->retry_cnt > 7)
		return EINVAL;
	if ((mask & M(RNR_RETRY)) && a->rnr_retry > 7)
		return EINVAL;
	if ((mask & M(DEST_QPN)) && a->dest_qp_num > 0xffffff)
		return EINVAL;
	if ((mask & M(PATH_MIG_STATE)) && a->path_mig_state > IBV_MIG_ARMED)
		return EINVAL;
	if (mask & M(AV)) {
		/* Ethernet link layer: the address must carry a GRH, and the
		 * source GID index must name a GID of our table. */
		if (!a->ah_attr.is_global)
			return EINVAL;
		if (a->ah_attr.port_num && a->ah_attr.port_num != SV_PORT)
			return EINVAL;
		if (sv_query_gid_locked(a->ah_attr.grh.sgid_index, sgid) ||
		    sv_gid_is_zero(sgid))
			return EINVAL;
	}
	return 0;
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
	struct sv_qp *qp;
	enum ibv_qp_state cur, nxt;
	union ibv_gid sgid;
	int req, opt, ret;

	if (!ibqp || !a)
		return EINVAL;
	qp = to_qp(ibqp);
	sv_lock();
	cur = qp->attr.qp_state;
	nxt = mask & M(STATE) ? a->qp_state : cur;
	ret = EINVAL;
	if ((mask & M(CUR_STATE)) && a->cur_qp_state != cur)
		goto out;
	if (nxt > IBV_QPS_ERR)
		goto out;
	if (sv_qp_trans(qp->ibv.qp_type, cur, nxt, &req, &opt) < 0)
		goto out;
	if ((mask & ~(req | opt | M(STATE))) || (mask & req) != req)
		goto out;
	ret = sv_qp_check_values(a, mask, &sgid);
	if (ret)
		goto out;

	if (nxt == IBV_QPS_RESET) {
		sv_qp_reset(qp);
		goto done;
	}
	if (mask & M(PORT))
		qp->attr.port_num = a->port_num;
	if (mask & M(PKEY_INDEX))
		qp->attr.pkey_index = a->pkey_index;
	if (mask & M(QKEY))
		qp->attr.qkey = a->qkey;
	if (mask & M(ACCESS_FLAGS))
		qp->attr.qp_access_flags = a->qp_access_flags;
	if (mask & M(PATH_MTU))
		qp->attr.path_mtu = a->path_mtu;
	if (mask & M(DEST_QPN))
		qp->attr.dest_qp_num = a->dest_qp_num;
	if (mask & M(RQ_PSN))
		qp->attr.rq_psn = a->rq_psn & 0xffffff;
	if (mask & M(SQ_PSN))
		qp->attr.sq_psn = a->sq_psn & 0xffffff;
	if (mask & M(MAX_DEST_RD_ATOMIC))
		qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
	if (mask & M(MAX_QP_RD_ATOMIC))
		qp->attr.max_rd_atomic = a->max_rd_atomic;
	if (mask & M(MIN_RNR_TIMER))
		qp->attr.min_rnr_timer = a->min_rnr_timer;
	if (mask & M(TIMEOUT))
		qp->attr.timeout = a->timeout;
	if (mask & M(RETRY_CNT))
		qp->attr.retry_cnt = a->retry_cnt;
	if (mask & M(RNR_RETRY))
		qp->attr.rnr_retry = a->rnr_retry;
	if (mask & M(PATH_MIG_STATE))
		qp->attr.path_mig_state = a->path_mig_state;
	if (mask & M(EN_SQD_ASYNC_NOTIFY))
		qp->attr.en_sqd_async_notify = a->en_sqd_async_notify;
	if (mask & M(ALT_PATH)) {
		qp->attr.alt_ah_attr = a->alt_ah_attr;
		qp->attr.alt_pkey_index = a->alt_pkey_index;
		qp->attr.alt_port_num = a->alt_port_num;
		qp->attr.alt_timeout = a->alt_timeout;
	}
	if (mask & M(AV)) {
		qp->attr.ah_attr = a->ah_attr;
		qp->sgid = sgid;
	}

	if (nxt == IBV_QPS_ERR) {
		sv_qp_to_error(qp);
		goto done;
	}
	if (nxt == IBV_QPS_RTS && cur != IBV_QPS_RTS) {
		qp->retry_left = qp->attr.retry_cnt;
		qp->rnr_left = qp->attr.rnr_retry;
		qp->retry_at = 0;
	}
	sv_qp_set_state(qp, nxt);
done:
	ret = 0;
out:
	sv_unlock();
	if (ret == 0)
		sv_kick();
	return ret;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
			   int mask, struct ibv_qp_init_attr *init)
{
	struct sv_qp *qp;

	(void)mask; /* everything is always reported */
	if (!ibqp || !attr || !init)
		return EINVAL;
	qp = to_qp(ibqp);
	sv_lock();
	*attr = qp->attr;
	attr->cur_qp_state = qp->attr.qp_state;
	attr->cap = qp->cap;
	attr->sq_draining = 0;
	memset(init, 0, sizeof(*init));
	init->qp_context = qp->ibv.qp_context;
	init->send_cq = qp->ibv.send_cq;
	init->recv_cq = qp->ibv.recv_cq;
	init->srq = qp->ibv.srq;
	init->cap = qp->cap;
	init->qp_type = qp->ibv.qp_type;
	init->sq_sig_all = qp->sq_sig_all;
	sv_unlock();
	return 0;
}

/* ---- destroy ---- */

void sv_qp_free(struct sv_qp *qp)
{
	struct sv_context *ctx = to_ctx(qp->ibv.context);

	sv_qp_reset(qp);
	sv_async_purge(ctx, qp);
	sv_list_del(&qp->hlink);
	sv_list_del(&qp->all);
	sv_list_del(&qp->link);
	ctx->n_qp--;
	to_pd(qp->ibv.pd)->refs--;
	to_cq(qp->ibv.send_cq)->refs--;
	to_cq(qp->ibv.recv_cq)->refs--;
	if (qp->ibv.srq)
		to_srq(qp->ibv.srq)->refs--;
	pthread_mutex_destroy(&qp->ibv.mutex);
	pthread_cond_destroy(&qp->ibv.cond);
	free(qp);
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	if (!ibqp)
		return EINVAL;
	sv_lock();
	sv_qp_free(to_qp(ibqp));
	sv_unlock();
	sv_kick(); /* refusals of held messages may be queued */
	return 0;
}

/* ---- posting ---- */

/* Builds a send WQE: checks the request and gathers its payload. A bad
 * SGE does not fail the post: the WQE completes with the error. */
static int sv_build_swqe(struct sv_qp *qp, struct ibv_send_wr *wr,
			 struct sv_swqe **out)
{
	uint64_t len = 0;
	struct sv_swqe *w;
	uint8_t *dst;

	if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)
		return EINVAL;
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
		return EINVAL;
	if (qp->ibv.qp_type == IBV_QPT_UD && !wr->wr.ud.ah)
		return EINVAL;
	for (int i = 0; i < wr->num_sge; i++)
		len += wr->sg_list[i].length;
	if ((wr->send_flags & IBV_SEND_INLINE) && len > qp->cap.max_inline_data)
		return EINVAL;
	if (qp->ibv.qp_type == IBV_QPT_UD ? len > SV_MTU_BYTES : len > SV_MAX_MSG)
		return EINVAL;
	if (qp->sq_count >= qp->cap.max_send_wr)
		return ENOMEM;

	w = calloc(1, sizeof(*w));
	if (!w)
		return ENOMEM;
	w->data = sv_buf_new((uint32_t)len);
	if (!w->data) {
		free(w);
		return ENOMEM;
	}
	w->wr_id = wr->wr_id;
	w->opcode = wr->opcode;
	w->signaled = !!(wr->send_flags & IBV_SEND_SIGNALED);
	w->solicited = !!(wr->send_flags & IBV_SEND_SOLICITED);
	w->with_imm = wr->opcode == IBV_WR_SEND_WITH_IMM;
	w->imm = wr->imm_data;
	w->err = IBV_WC_SUCCESS;
	w->state = SV_WQE_QUEUED;
	dst = w->data->data;
	for (int i = 0; i < wr->num_sge; i++) {
		const struct ibv_sge *s = &wr->sg_list[i];
		const void *src;

		if (s->length == 0)
			continue;
		if (wr->send_flags & IBV_SEND_INLINE) {
			src = (const void *)(uintptr_t)s->addr;
		} else {
			src = sv_mr_check(qp->ibv.pd, s, 0, &w->err);
			if (!src)
				break;
		}
		memcpy(dst, src, s->length);
		dst += s->length;
	}
	if (qp->ibv.qp_type == IBV_QPT_UD) {
		struct sv_ah *ah = to_ah(wr->wr.ud.ah);

		w->dgid = ah->dgid;
		w->sgid = ah->sgid;
		w->remote_qpn = wr->wr.ud.remote_qpn;
		/* a qkey with the high bit set means "use the QP's own" */
		w->remote_qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ?
					 qp->attr.qkey : wr->wr.ud.remote_qkey;
	}
	*out = w;
	return 0;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		 struct ibv_send_wr **bad)
{
	struct sv_qp *qp = to_qp(ibqp);
	int ret = 0, kick;

	sv_lock();
	switch (qp->attr.qp_state) {
	case IBV_QPS_RTS:
	case IBV_QPS_SQD:
	case IBV_QPS_SQE:
	case IBV_QPS_ERR:
		break;
	default:
		ret = EINVAL;
		break;
	}
	for (; wr && !ret; wr = wr->next) {
		struct sv_swqe *w;

		ret = sv_build_swqe(qp, wr, &w);
		if (ret)
			break;
		sv_list_add_tail(&qp->sq, &w->link);
		qp->sq_count++;
	}
	if (ret && bad)
		*bad = wr;
	/* In SQE or ERR new send WQEs are flushed at once. */
	if (qp->attr.qp_state == IBV_QPS_SQE || qp->attr.qp_state == IBV_QPS_ERR)
		sv_flush_sq(qp);
	/* An RC QP with messages in flight is clocked by their replies: the
	 * progress thread, woken by the next one, sends what queued meanwhile
	 * in one system call. Otherwise the send leaves from here. */
	if (qp->ibv.qp_type == IBV_QPT_RC && qp->inflight > 0 &&
	    qp->attr.qp_state == IBV_QPS_RTS)
		kick = 0;
	else
		kick = sv_service_now(qp);
	sv_unlock();
	if (kick)
		sv_kick();
	return ret;
}

/*
 * sv_rwqe_new checks a receive work request against a queue holding count
 * of at most max_wr requests of at most max_sge SGEs, and copies it: 0, or
 * EINVAL (too many SGEs) or ENOMEM (queue full, or no memory).
 */
int sv_rwqe_new(const struct ibv_recv_wr *wr, uint32_t max_sge, uint32_t count,
		uint32_t max_wr, struct sv_rwqe **out)
{
	struct sv_rwqe *r;

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge)
		return EINVAL;
	if (count >= max_wr)
		return ENOMEM;
	r = calloc(1, sizeof(*r));
	if (!r)
		return ENOMEM;
	r->wr_id = wr->wr_id;
	r->num_sge = wr->num_sge;
	if (wr->num_sge)
		memcpy(r->sge, wr->sg_list, sizeof(r->sge[0]) * wr->num_sge);
	*out = r;
	return 0;
}

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		 struct ibv_recv_wr **bad)
{
	struct sv_qp *qp = to_qp(ibqp);
	int ret = 0, kick;

	sv_lock();
	if (qp->ibv.srq || qp->attr.qp_state == IBV_QPS_RESET)
		ret = EINVAL;
	for (; wr && !ret; wr = wr->next) {
		struct sv_rwqe *r;

		ret = sv_rwqe_new(wr, qp->cap.max_recv_sge, qp->rq_count, qp->cap.max_recv_wr, &r);
		if (ret)
			break;
		sv_list_add_tail(&qp->rq, &r->link);
		qp->rq_count++;
	}
	if (ret && bad)
		*bad = wr;
	if (qp->attr.qp_state == IBV_QPS_ERR)
		sv_flush_rq(qp);
	kick = !sv_list_empty(&qp->held) && sv_service_now(qp);
	sv_unlock();
	if (kick)
		sv_kick();
	return ret;
}
