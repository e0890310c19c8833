// Package pvsim is a model of the VMware paravirtual RDMA device.
package pvsim
