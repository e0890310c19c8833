# UCX's settings for this device, in one place (sourced by amside.sh,
# ucxhost.sh and test.sh): ucx_env DEVICE [GID_INDEX] sets the array
# UCX_ENV for UCX on DEVICE's port 1 (vmw_pvrdma0 in a reference guest,
# softverbs0 on the host over the backend, vfrdma0 over the drop-in in a
# vfrdma guest) at the GID index that routes (default 1). Why each
# (measured on the bench, see ucx-anchor in the shared notes):
#   UCX_IB_GID_INDEX=1         the kernel stack's GID 0 never routes on the
#                              bench; vfrdma binds its GID at index 0, so
#                              over the drop-in: ucx_env vfrdma0 0.
#   UCX_*_TX_MIN_SGE=4, 3      the device allows 4 SGEs; UCX asks 5 and
#                              fails to create its RC QP.
#   UCX_RC_VERBS_FLUSH_MODE=fc UCX's default flush posts an empty RDMA
#                              WRITE, which the device does not carry.
#   UCX_RNDV_THRESH=inf        rendezvous needs RDMA READ.
#   UCX_TLS=rc_v               rc_verbs, with ud_verbs as the auxiliary
#                              transport its wire-up needs.
# Linux's vmw_pvrdma allows no inline data, so every UCX active message is
# am_bcopy (at most 8255 B a fragment on RC; larger ones go in fragments).
ucx_env() {
  UCX_ENV=("UCX_NET_DEVICES=$1:1" "UCX_IB_GID_INDEX=${2:-1}" UCX_RC_VERBS_TX_MIN_SGE=4 UCX_UD_VERBS_TX_MIN_SGE=3
    UCX_RC_VERBS_FLUSH_MODE=fc UCX_RNDV_THRESH=inf UCX_TLS=rc_v UCX_WARN_UNUSED_ENV_VARS=n)
}
