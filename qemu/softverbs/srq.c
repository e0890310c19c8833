/*
 * Shared receive queues.
 *
 * An SRQ is a FIFO of receive WQEs taken by the QPs attached to it. The
 * limit is a one-shot watermark: when a receive is taken and fewer than
 * 'limit' WQEs remain, the limit disarms (reads back as 0) and an
 * IBV_EVENT_SRQ_LIMIT_REACHED async event is queued. A limit given at
 * creation is armed too.
 */
#include "softverbs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *ibpd,
					 struct ibv_srq_init_attr *init)
{
	struct sv_context *ctx;
	struct sv_srq *srq;

	if (!ibpd || !init) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(ibpd->context);
	if (init->attr.max_wr < 1 || init->attr.max_wr > SV_MAX_SRQ_WR ||
	    init->attr.max_sge > SV_MAX_SGE ||
	    init->attr.srq_limit > init->attr.max_wr) {
		errno = EINVAL;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	srq->ibv.context = ibpd->context;
	srq->ibv.srq_context = init->srq_context;
	srq->ibv.pd = ibpd;
	pthread_mutex_init(&srq->ibv.mutex, NULL);
	pthread_cond_init(&srq->ibv.cond, NULL);
	sv_list_init(&srq->wqes);
	srq->max_wr = init->attr.max_wr;
	srq->max_sge = init->attr.max_sge ? init->attr.max_sge : 1;
	srq->limit = init->attr.srq_limit;
	sv_lock();
	if (ctx->n_srq >= SV_MAX_SRQ) {
		sv_unlock();
		free(srq);
		errno = ENOMEM;
		return NULL;
	}
	srq->ibv.handle = sv.next_key++;
	to_pd(ibpd)->refs++;
	sv_list_add_tail(&ctx->srqs, &srq->link);
	ctx->n_srq++;
	sv_unlock();
	init->attr.max_wr = srq->max_wr;
	init->attr.max_sge = srq->max_sge;
	return &srq->ibv;
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
			     int mask)
{
	struct sv_srq *srq;
	uint32_t max_wr, limit;

	if (!ibsrq || !attr || (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)))
		return EINVAL;
	srq = to_srq(ibsrq);
	sv_lock();
	max_wr = mask & IBV_SRQ_MAX_WR ? attr->max_wr : srq->max_wr;
	limit = mask & IBV_SRQ_LIMIT ? attr->srq_limit : srq->limit;
	if (max_wr < 1 || max_wr > SV_MAX_SRQ_WR || max_wr < srq->count ||
	    limit > max_wr) {
		sv_unlock();
		return EINVAL;
	}
	srq->max_wr = max_wr;
	srq->limit = limit;
	sv_unlock();
	return 0;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct sv_srq *srq;

	if (!ibsrq || !attr)
		return EINVAL;
	srq = to_srq(ibsrq);
	sv_lock();
	attr->max_wr = srq->max_wr;
	attr->max_sge = srq->max_sge;
	attr->srq_limit = srq->limit;
	sv_unlock();
	return 0;
}

void sv_srq_free(struct sv_srq *srq)
{
	struct sv_context *ctx = to_ctx(srq->ibv.context);
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &srq->wqes) {
		sv_list_del(p);
		free(sv_container_of(p, struct sv_rwqe, link));
	}
	sv_async_purge(ctx, srq);
	to_pd(srq->ibv.pd)->refs--;
	sv_list_del(&srq->link);
	ctx->n_srq--;
	pthread_mutex_destroy(&srq->ibv.mutex);
	pthread_cond_destroy(&srq->ibv.cond);
	free(srq);
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct sv_srq *srq;

	if (!ibsrq)
		return EINVAL;
	srq = to_srq(ibsrq);
	sv_lock();
	if (srq->refs) {
		sv_unlock();
		return EBUSY;
	}
	sv_srq_free(srq);
	sv_unlock();
	return 0;
}

/* Takes the oldest WQE; checks the limit. Called locked. */
struct sv_rwqe *sv_srq_take(struct sv_srq *srq)
{
	struct sv_rwqe *r = sv_list_first(&srq->wqes, struct sv_rwqe, link);

	if (!r)
		return NULL;
	sv_list_del(&r->link);
	srq->count--;
	if (srq->limit && srq->count < srq->limit) {
		struct ibv_async_event ev = {
			.element.srq = &srq->ibv,
			.event_type = IBV_EVENT_SRQ_LIMIT_REACHED,
		};

		srq->limit = 0;
		sv_async_push(to_ctx(srq->ibv.context), &ev);
	}
	return r;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr **bad)
{
	struct sv_srq *srq = to_srq(ibsrq);
	int ret = 0;

	sv_lock();
	for (; wr; wr = wr->next) {
		struct sv_rwqe *r;

		ret = sv_rwqe_new(wr, srq->max_sge, srq->count, srq->max_wr, &r);
		if (ret)
			break;
		sv_list_add_tail(&srq->wqes, &r->link);
		srq->count++;
	}
	if (ret && bad)
		*bad = wr;
	sv_unlock();
	/* QPs of this SRQ may hold messages waiting for a receive. */
	sv_kick();
	return ret;
}
