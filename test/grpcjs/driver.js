// A dumb pipe between the Go test and @grpc/grpc-js: it opens one channel
// to the ext_proc server and runs Process streams as told, passing messages
// as opaque bytes both ways. Everything about ext_proc (what to send, when,
// what the answers mean) is the Go side's; this file only speaks grpc-js.
//
//   node driver.js '{"target":"127.0.0.1:9002","tls":false,"options":{...}}'
//
// stdin, one JSON object a line:
//   {"op":"open","id":N,"deadline_ms":300}  start stream N (deadline optional)
//   {"op":"send","id":N,"b64":"..."}        write one message on stream N
//   {"op":"end","id":N}                     half-close stream N
//   {"op":"cancel","id":N}                  cancel stream N (RST_STREAM)
// stdout, one JSON object a line:
//   {"ev":"headers","id":N,"metadata":{}}                    the response headers (initial metadata)
//   {"ev":"msg","id":N,"b64":"..."}                          a message received
//   {"ev":"status","id":N,"code":C,"details":"","metadata":{},"ms":T}
//                                                            stream N ended, T ms after open
//   {"ev":"state","state":"READY","ms":T}                    channel connectivity changes
//   {"ev":"log","text":"..."}                                grpc-js log and trace lines
//   {"ev":"done"}                                            stdin closed and every stream ended
// grpc-js reads GRPC_TRACE and GRPC_VERBOSITY from the environment when it
// loads; its log lines come here as "log" events instead of stderr.
'use strict';

const grpc = require('@grpc/grpc-js');
const readline = require('readline');

const METHOD = '/envoy.service.ext_proc.v3.ExternalProcessor/Process';
const cfg = JSON.parse(process.argv[2]);
const start = process.hrtime.bigint();
const sinceStart = () => Number(process.hrtime.bigint() - start) / 1e6;

function emit(ev) {
  process.stdout.write(JSON.stringify(ev) + '\n');
}

const logLine = (...args) => emit({ ev: 'log', text: args.map(String).join(' ') });
grpc.setLogger({ error: logLine, info: logLine, debug: logLine });

// TLS without verification: the processors serve a self-signed certificate
// by default, and gateways' clusters for them do not verify it either.
const creds = cfg.tls
  ? grpc.credentials.createSsl(null, null, null, { rejectUnauthorized: false })
  : grpc.credentials.createInsecure();
const client = new grpc.Client(cfg.target, creds, cfg.options || {});
const channel = client.getChannel();

function watch(state) {
  channel.watchConnectivityState(state, Date.now() + 3600e3, (err) => {
    if (err) return;
    const now = channel.getConnectivityState(false);
    // SHUTDOWN is the driver's own close, the end of the watch.
    if (now === grpc.connectivityState.SHUTDOWN) return;
    emit({ ev: 'state', state: grpc.connectivityState[now], ms: sinceStart() });
    watch(now);
  });
}
const initial = channel.getConnectivityState(false);
emit({ ev: 'state', state: grpc.connectivityState[initial], ms: sinceStart() });
watch(initial);

const calls = new Map();
let stdinClosed = false;

function maybeExit() {
  if (stdinClosed && calls.size === 0) {
    client.close();
    emit({ ev: 'done' });
    process.exit(0);
  }
}

function metadataJSON(md) {
  const out = {};
  if (!md) return out;
  for (const [k, v] of Object.entries(md.getMap())) {
    out[k] = Buffer.isBuffer(v) ? v.toString('base64') : String(v);
  }
  return out;
}

function open(cmd) {
  const t0 = process.hrtime.bigint();
  const opts = {};
  if (cmd.deadline_ms) opts.deadline = Date.now() + cmd.deadline_ms;
  const call = client.makeBidiStreamRequest(METHOD, (b) => b, (b) => b, new grpc.Metadata(), opts);
  calls.set(cmd.id, call);
  call.on('metadata', (md) => emit({ ev: 'headers', id: cmd.id, metadata: metadataJSON(md) }));
  call.on('data', (b) => emit({ ev: 'msg', id: cmd.id, b64: b.toString('base64') }));
  // A failed call emits 'error' as well as 'status'; the status says it all.
  call.on('error', () => {});
  call.on('status', (s) => {
    emit({
      ev: 'status', id: cmd.id, code: s.code, details: s.details,
      metadata: metadataJSON(s.metadata), ms: Number(process.hrtime.bigint() - t0) / 1e6,
    });
    calls.delete(cmd.id);
    maybeExit();
  });
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (line === '') return;
  const cmd = JSON.parse(line);
  const call = calls.get(cmd.id);
  switch (cmd.op) {
    case 'open':
      open(cmd);
      return;
    case 'send':
      if (call) call.write(Buffer.from(cmd.b64, 'base64'));
      return;
    case 'end':
      if (call) call.end();
      return;
    case 'cancel':
      if (call) call.cancel();
      return;
    default:
      emit({ ev: 'log', text: 'driver: unknown op ' + cmd.op });
  }
});
rl.on('close', () => {
  stdinClosed = true;
  maybeExit();
});
