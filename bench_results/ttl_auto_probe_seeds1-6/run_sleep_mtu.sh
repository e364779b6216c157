cd "$(dirname "$0")/../.."  # the repository root; run as root (network namespaces)
mkdir -p /tmp/dsb41
C=sync_lowbit,acco_lowbit_int4_adaptive,auto_lowbit_int4_streaming
for s in 1 2; do
  python -m benchmarks run --sweep full --only time_to_loss --rates 100mbit --configs $C --seed $s --out /tmp/dsb41/sleep_$s > /tmp/dsb41/sleep_$s.log 2>&1
  echo "sleep $s rc=$? $(date +%T)" >> /tmp/dsb41/status
  python -m benchmarks run --sweep full --only time_to_loss_real --rates 100mbit --mtu 9000 --configs $C --seed $s --out /tmp/dsb41/mtu_$s > /tmp/dsb41/mtu_$s.log 2>&1
  echo "mtu $s rc=$? $(date +%T)" >> /tmp/dsb41/status
done
