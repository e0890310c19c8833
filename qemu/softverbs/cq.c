/*
 * Completion queues and completion channels.
 *
 * A CQ is a ring of struct ibv_wc that grows when full, so no completion
 * is ever lost (an overrun is not reported as an error). A channel is an
 * eventfd (EFD_SEMAPHORE) plus a FIFO of CQs that fired: the fd's counter
 * equals the number of queued events, so it is pollable and honours
 * O_NONBLOCK set by the user.
 */
#include "softverbs.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static void sv_cq_reap(struct sv_cq *cq);

/* ---- channel ---- */

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct sv_channel *ch;

	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	ch->ibv.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ch->ibv.fd < 0) {
		free(ch);
		return NULL;
	}
	ch->ibv.context = context;
	sv_list_init(&ch->events);
	sv_lock();
	sv_list_add_tail(&to_ctx(context)->channels, &ch->link);
	sv_unlock();
	return &ch->ibv;
}

void sv_channel_free(struct sv_channel *ch)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &ch->events) {
		sv_list_del(p);
		free(sv_container_of(p, struct sv_cq_event, link));
	}
	sv_list_del(&ch->link);
	close(ch->ibv.fd);
	free(ch);
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct sv_channel *ch;

	if (!channel)
		return EINVAL;
	ch = to_channel(channel);
	sv_lock();
	if (ch->refs) {
		sv_unlock();
		return EBUSY;
	}
	sv_channel_free(ch);
	sv_unlock();
	return 0;
}

static void sv_channel_push(struct sv_channel *ch, struct sv_cq *cq)
{
	struct sv_cq_event *e = calloc(1, sizeof(*e));

	if (!e)
		return;
	e->cq = cq;
	sv_list_add_tail(&ch->events, &e->link);
	sv_event_signal(ch->ibv.fd);
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel,
			       struct ibv_cq **cq, void **cq_context)
{
	struct sv_channel *ch;

	if (!channel || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	ch = to_channel(channel);
	for (;;) {
		struct sv_cq_event *e;
		uint64_t v;

		/* Blocks unless the user set O_NONBLOCK on the fd. */
		if (read(channel->fd, &v, sizeof(v)) != sizeof(v)) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		sv_lock();
		e = sv_list_first(&ch->events, struct sv_cq_event, link);
		if (e) {
			sv_list_del(&e->link);
			/* destroy waits until the caller has acked it */
			e->cq->events_reported++;
		}
		sv_unlock();
		if (e) {
			*cq = &e->cq->ibv;
			*cq_context = e->cq->ibv.cq_context;
			free(e);
			return 0;
		}
		/* the event was purged by a destroy in between: wait again */
	}
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	if (!cq)
		return;
	sv_lock();
	cq->comp_events_completed += nevents;
	sv_cq_reap(to_cq(cq));
	sv_unlock();
}

/* ---- CQ ---- */

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe,
				       void *cq_context,
				       struct ibv_comp_channel *channel,
				       int comp_vector)
{
	struct sv_context *ctx;
	struct sv_cq *cq;

	if (!context || cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 ||
	    comp_vector >= context->num_comp_vectors ||
	    (channel && channel->context != context)) {
		errno = EINVAL;
		return NULL;
	}
	ctx = to_ctx(context);
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->cap = (uint32_t)cqe;
	cq->ring = calloc(cq->cap, sizeof(*cq->ring));
	if (!cq->ring) {
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->ibv.context = context;
	cq->ibv.channel = channel;
	cq->ibv.cq_context = cq_context;
	cq->ibv.cqe = cqe;
	pthread_mutex_init(&cq->ibv.mutex, NULL);
	pthread_cond_init(&cq->ibv.cond, NULL);
	sv_lock();
	if (ctx->n_cq >= SV_MAX_CQ) {
		sv_unlock();
		free(cq->ring);
		free(cq);
		errno = ENOMEM;
		return NULL;
	}
	cq->ibv.handle = sv.next_key++;
	if (channel)
		to_channel(channel)->refs++;
	sv_list_add_tail(&ctx->cqs, &cq->link);
	ctx->n_cq++;
	sv_unlock();
	return &cq->ibv;
}

/* Removes the CQ's queued events from its channel. */
static void sv_cq_purge_events(struct sv_cq *cq)
{
	struct sv_channel *ch;
	struct sv_list *p, *t;

	if (!cq->ibv.channel)
		return;
	ch = to_channel(cq->ibv.channel);
	sv_list_each_safe(p, t, &ch->events) {
		struct sv_cq_event *e = sv_container_of(p, struct sv_cq_event, link);

		if (e->cq == cq) {
			sv_list_del(p);
			free(e);
			sv_event_consume(ch->ibv.fd);
		}
	}
}

/* Frees a destroyed CQ's memory once no event of it is out. Called locked. */
static void sv_cq_reap(struct sv_cq *cq)
{
	if (!cq->zombie || cq->events_reported != cq->ibv.comp_events_completed)
		return;
	pthread_mutex_destroy(&cq->ibv.mutex);
	pthread_cond_destroy(&cq->ibv.cond);
	free(cq->ring);
	free(cq);
}

/*
 * Takes a CQ out of its context and frees it. Called locked.
 *
 * The receiver of an event (ibv_get_cq_event) goes on using the CQ until
 * it acks the event: QEMU's completion thread arms and polls the CQ, then
 * acks, while the guest may destroy that CQ from its vCPU thread. Freeing
 * it there was a use after free in QEMU's process: a loop of the interop
 * tier saw the reference guest's QEMU die of SIGSEGV, and abort on a
 * corrupted heap, as the next ping-pong started. libibverbs makes destroy
 * wait for the acks instead; here a wait could deadlock QEMU (its
 * completion thread takes the big QEMU lock to raise an interrupt, which
 * the destroying vCPU thread holds). So the CQ is emptied and detached at
 * once (polls of it return nothing, arming it does nothing), its queued
 * events are dropped, and its memory is freed by the last ack.
 */
void sv_cq_free(struct sv_cq *cq)
{
	struct sv_context *ctx = to_ctx(cq->ibv.context);

	sv_cq_purge_events(cq);
	sv_async_purge(ctx, cq);
	if (cq->ibv.channel)
		to_channel(cq->ibv.channel)->refs--;
	sv_list_del(&cq->link);
	ctx->n_cq--;
	__atomic_store_n(&cq->count, 0, __ATOMIC_RELEASE);
	cq->armed = SV_ARM_NONE;
	cq->zombie = 1;
	sv_cq_reap(cq);
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct sv_cq *cq;

	if (!ibcq)
		return EINVAL;
	cq = to_cq(ibcq);
	sv_lock();
	if (cq->refs) {
		sv_unlock();
		return EBUSY;
	}
	sv_cq_free(cq);
	sv_unlock();
	return 0;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct sv_cq *cq;

	if (!ibcq || cqe < 1 || cqe > SV_MAX_CQE)
		return EINVAL;
	cq = to_cq(ibcq);
	sv_lock();
	if ((uint32_t)cqe < cq->count) {
		sv_unlock();
		return EINVAL;
	}
	/* The ring grows by itself; only the advertised size changes. */
	cq->ibv.cqe = cqe;
	sv_unlock();
	return 0;
}

static int sv_cq_grow(struct sv_cq *cq)
{
	uint32_t ncap = cq->cap * 2;
	struct ibv_wc *n = calloc(ncap, sizeof(*n));

	if (!n)
		return -1;
	for (uint32_t i = 0; i < cq->count; i++)
		n[i] = cq->ring[(cq->head + i) % cq->cap];
	free(cq->ring);
	cq->ring = n;
	cq->cap = ncap;
	cq->head = 0;
	return 0;
}

/* Appends a completion and fires the channel if the CQ is armed for it.
 * Error completions count as solicited. Called locked. */
void sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc, int solicited)
{
	if (cq->count == cq->cap && sv_cq_grow(cq) < 0)
		return; /* out of memory: nothing sensible left to do */
	cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
	__atomic_store_n(&cq->count, cq->count + 1, __ATOMIC_RELEASE);
	if (cq->armed == SV_ARM_ANY ||
	    (cq->armed == SV_ARM_SOLICITED &&
	     (solicited || wc->status != IBV_WC_SUCCESS))) {
		cq->armed = SV_ARM_NONE;
		if (cq->ibv.channel)
			sv_channel_push(to_channel(cq->ibv.channel), cq);
	}
}

/* Drops the completions of one QP (QP reset or destroyed). Called locked. */
void sv_cq_purge_qp(struct sv_cq *cq, uint32_t qp_num)
{
	uint32_t kept = 0;

	for (uint32_t i = 0; i < cq->count; i++) {
		struct ibv_wc wc = cq->ring[(cq->head + i) % cq->cap];

		if (wc.qp_num != qp_num)
			cq->ring[(cq->head + kept++) % cq->cap] = wc;
	}
	__atomic_store_n(&cq->count, kept, __ATOMIC_RELEASE);
}

int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct sv_cq *cq = to_cq(ibcq);
	int got = 0;

	if (n < 0)
		return -EINVAL;
	/* Empty CQ: make progress here if the lock is free (what the
	 * connections hold may complete this CQ), else give up the CPU: the
	 * completion it waits for is then made by the progress thread. */
	if (__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE) == 0) {
		if (sv.no_poll_progress || !sv_poll_progress())
			sched_yield();
		if (__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE) == 0)
			return 0;
	}
	sv_lock();
	while (got < n && cq->count) {
		wc[got++] = cq->ring[cq->head];
		cq->head = (cq->head + 1) % cq->cap;
		__atomic_store_n(&cq->count, cq->count - 1, __ATOMIC_RELEASE);
	}
	sv_unlock();
	return got;
}

/* Arms the CQ: the next completion (or the next solicited or error one)
 * queues one event on the channel. Arming for any completion wins over
 * solicited-only. */
int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct sv_cq *cq = to_cq(ibcq);

	sv_lock();
	if (!solicited_only)
		cq->armed = SV_ARM_ANY;
	else if (cq->armed == SV_ARM_NONE)
		cq->armed = SV_ARM_SOLICITED;
	sv_unlock();
	return 0;
}
