// Dashboard panel definitions for the inference latency board.
import type { PanelConfig, Threshold } from "./types";

export const REFRESH_MS = 15_000;
export const MAX_POINTS = 1_440; // one day at one-minute resolution
export const VIEWPORTS = [
  { name: "desktop", width: 1920, height: 1080, dpr: 1 },
  { name: "laptop", width: 1440, height: 900, dpr: 2 },
  { name: "tablet", width: 1024, height: 768, dpr: 2 },
  { name: "phone", width: 390, height: 844, dpr: 3 },
] as const;

const latencyThresholds: Threshold[] = [
  { value: 0, color: "#2e7d32" },
  { value: 250, color: "#f9a825" },
  { value: 1000, color: "#ef6c00" },
  { value: 5000, color: "#c62828" },
];

export const panels: PanelConfig[] = [
  {
    id: "ttft-p99",
    title: "Time to first token, p99 (ms)",
    query: 'histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m]))) * 1000',
    gridPos: { x: 0, y: 0, w: 12, h: 8 },
    thresholds: latencyThresholds,
    yAxis: { min: 0, max: 8000, ticks: [0, 500, 1000, 2000, 4000, 8000] },
  },
  {
    id: "tokens-per-second",
    title: "Generated tokens per second",
    query: "sum(rate(vllm:generation_tokens_total[1m]))",
    gridPos: { x: 12, y: 0, w: 12, h: 8 },
    yAxis: { min: 0, max: 120000, ticks: [0, 30000, 60000, 90000, 120000] },
  },
  {
    id: "kv-cache",
    title: "KV cache usage (%)",
    query: "avg by (instance) (vllm:gpu_cache_usage_perc) * 100",
    gridPos: { x: 0, y: 8, w: 8, h: 6 },
    yAxis: { min: 0, max: 100, ticks: [0, 25, 50, 75, 90, 100] },
  },
  {
    id: "batch-shape",
    title: "Batch shape [requests, tokens]",
    query: "avg(vllm:num_requests_running), avg(vllm:num_batched_tokens)",
    gridPos: { x: 8, y: 8, w: 16, h: 6 },
  },
];

export function bucketEdges(start = 0.001, factor = 2, count = 16): number[] {
  return Array.from({ length: count }, (_, i) => +(start * factor ** i).toPrecision(6));
}
// bucketEdges() -> [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384, 32.768]

export const colorScale = [0x1a237e, 0x283593, 0x303f9f, 0x3949ab, 0x3f51b5, 0x5c6bc0, 0x7986cb, 0x9fa8da];
