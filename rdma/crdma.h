// C helpers of package rdma. Each one does in a single cgo call what would
// otherwise take several crossings, or hides a static inline verbs function
// or a union that cgo cannot reach.
#ifndef URNBD_CRDMA_H
#define URNBD_CRDMA_H

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// ------------------------------------------------------------------ CM

// A CM event flattened into plain fields.
struct urnbd_cm_event {
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int type;
	int status;
	const void *private_data;
	uint32_t private_data_len;
	uint32_t qp_num;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
};

static inline int urnbd_get_cm_event(struct rdma_event_channel *ch, struct urnbd_cm_event *out) {
	struct rdma_cm_event *ev;
	int ret = rdma_get_cm_event(ch, &ev);
	if (ret)
		return ret;
	memset(out, 0, sizeof(*out));
	out->ev = ev;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->type = ev->event;
	out->status = ev->status;
	if (ev->id && ev->id->ps != RDMA_PS_UDP && ev->id->ps != RDMA_PS_IPOIB) {
		out->private_data = ev->param.conn.private_data;
		out->private_data_len = ev->param.conn.private_data_len;
		out->qp_num = ev->param.conn.qp_num;
		out->responder_resources = ev->param.conn.responder_resources;
		out->initiator_depth = ev->param.conn.initiator_depth;
		out->retry_count = ev->param.conn.retry_count;
		out->rnr_retry_count = ev->param.conn.rnr_retry_count;
	}
	return 0;
}

static inline int urnbd_connect(struct rdma_cm_id *id, const void *pd, int pdlen,
		int rr, int id_, int retry, int rnr) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = (uint8_t)pdlen;
	p.responder_resources = (uint8_t)rr;
	p.initiator_depth = (uint8_t)id_;
	p.flow_control = 1;
	p.retry_count = (uint8_t)retry;
	p.rnr_retry_count = (uint8_t)rnr;
	return rdma_connect(id, &p);
}

static inline int urnbd_accept(struct rdma_cm_id *id, const void *pd, int pdlen,
		int rr, int id_, int rnr) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = (uint8_t)pdlen;
	p.responder_resources = (uint8_t)rr;
	p.initiator_depth = (uint8_t)id_;
	p.flow_control = 1;
	p.rnr_retry_count = (uint8_t)rnr;
	return rdma_accept(id, &p);
}

static inline struct ibv_context *urnbd_id_verbs(struct rdma_cm_id *id) { return id->verbs; }
static inline uint8_t urnbd_id_port(struct rdma_cm_id *id) { return id->port_num; }
static inline struct ibv_qp *urnbd_id_qp(struct rdma_cm_id *id) { return id->qp; }

static inline int urnbd_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
		struct ibv_cq *scq, struct ibv_cq *rcq, uint32_t max_send_wr,
		uint32_t max_recv_wr, uint32_t max_send_sge, uint32_t max_recv_sge,
		uint32_t max_inline, int sq_sig_all, struct ibv_qp_cap *out) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_type = IBV_QPT_RC;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.sq_sig_all = sq_sig_all;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = max_send_sge;
	a.cap.max_recv_sge = max_recv_sge;
	a.cap.max_inline_data = max_inline;
	int ret = rdma_create_qp(id, pd, &a);
	if (ret == 0)
		*out = a.cap;
	return ret;
}

// ------------------------------------------------------------------ CQ

// A work completion as package rdma's WC: imm in host byte order.
struct urnbd_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm;
	uint32_t flags;
	uint32_t qp_num;
	uint32_t src_qp;
};

// urnbd_poll_cq polls up to n completions, cap at a time, into the C
// array tmp and copies them into out: one crossing for a whole batch. It
// returns the number polled, or a negative value if ibv_poll_cq failed
// before any completion was polled.
static inline int urnbd_poll_cq(struct ibv_cq *cq, struct ibv_wc *tmp, int cap,
		struct urnbd_wc *out, int n) {
	int got = 0;
	while (got < n) {
		int want = n - got < cap ? n - got : cap;
		int r = ibv_poll_cq(cq, want, tmp);
		if (r < 0)
			return got ? got : r;
		for (int i = 0; i < r; i++) {
			struct urnbd_wc *o = &out[got + i];
			o->wr_id = tmp[i].wr_id;
			o->status = tmp[i].status;
			o->opcode = tmp[i].opcode;
			o->vendor_err = tmp[i].vendor_err;
			o->byte_len = tmp[i].byte_len;
			if (tmp[i].wc_flags & IBV_WC_WITH_IMM)
				o->imm = ntohl(tmp[i].imm_data);
			else if (tmp[i].wc_flags & IBV_WC_WITH_INV)
				o->imm = tmp[i].invalidated_rkey;
			else
				o->imm = 0;
			o->flags = tmp[i].wc_flags;
			o->qp_num = tmp[i].qp_num;
			o->src_qp = tmp[i].src_qp;
		}
		got += r;
		if (r < want)
			break;
	}
	return got;
}

enum { offsetof_urnbd_wc_src_qp = offsetof(struct urnbd_wc, src_qp) };

static inline int urnbd_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
	return ibv_req_notify_cq(cq, solicited_only);
}

// ------------------------------------------------------------------ posting

// A send work request as package rdma's batch writes it; imm in host order.
struct urnbd_send_wr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;
	uint32_t opcode;
	uint32_t flags;
	uint32_t num_sge;
	uint32_t pad;
};

// A receive work request as package rdma's batch writes it.
struct urnbd_recv_wr {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
};

// urnbd_post_send chains n requests (SGEs at sge + i*max_sge) into the
// ibv_send_wr array wrs and posts them with one ibv_post_send. It returns 0
// or an errno, and in *bad the index of the first request not posted.
static inline int urnbd_post_send(struct ibv_qp *qp, struct urnbd_send_wr *in,
		struct ibv_send_wr *wrs, struct ibv_sge *sge, int max_sge, int n, int *bad) {
	struct ibv_send_wr *badwr = NULL;
	*bad = n;
	if (n == 0)
		return 0;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wrs[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wrs[i + 1] : NULL;
		w->sg_list = &sge[i * max_sge];
		w->num_sge = (int)in[i].num_sge;
		w->opcode = (enum ibv_wr_opcode)in[i].opcode;
		w->send_flags = in[i].flags;
		if (w->opcode == IBV_WR_SEND_WITH_IMM || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
			w->imm_data = htonl(in[i].imm);
		else if (w->opcode == IBV_WR_SEND_WITH_INV)
			w->invalidate_rkey = in[i].imm;
		w->wr.rdma.remote_addr = in[i].remote_addr;
		w->wr.rdma.rkey = in[i].rkey;
	}
	int ret = ibv_post_send(qp, wrs, &badwr);
	if (ret && badwr)
		*bad = (int)(badwr - wrs);
	else if (ret)
		*bad = 0;
	return ret;
}

static inline int urnbd_post_recv(struct ibv_qp *qp, struct urnbd_recv_wr *in,
		struct ibv_recv_wr *wrs, struct ibv_sge *sge, int max_sge, int n, int *bad) {
	struct ibv_recv_wr *badwr = NULL;
	*bad = n;
	if (n == 0)
		return 0;
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr *w = &wrs[i];
		w->wr_id = in[i].wr_id;
		w->next = i + 1 < n ? &wrs[i + 1] : NULL;
		w->sg_list = &sge[i * max_sge];
		w->num_sge = (int)in[i].num_sge;
	}
	int ret = ibv_post_recv(qp, wrs, &badwr);
	if (ret && badwr)
		*bad = (int)(badwr - wrs);
	else if (ret)
		*bad = 0;
	return ret;
}

static inline uint32_t urnbd_htonl(uint32_t v) { return htonl(v); }

#endif
