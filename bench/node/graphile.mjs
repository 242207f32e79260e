// graphile-worker's side of bench/pg_compare.py: the same line protocol as the harness's
// Python clients (see bench/pg_compare.py's docstring).
//
//   node graphile.mjs migrate <dsn>        install graphile-worker's schema
//   node graphile.mjs child '<json spec>'  a publisher or a worker process
//
// Times are CLOCK_MONOTONIC seconds (process.hrtime), the clock of Python's
// time.monotonic(), so the harness compares them with its own.
import readline from "node:readline";
import pg from "pg";
import { Logger, makeWorkerUtils, run, runMigrations } from "graphile-worker";

const TASK = "bench";
const FILLER = "x".repeat(28);
const now = () => Number(process.hrtime.bigint()) / 1e9;
const payload = (seq, sent) => ({ seq, sent, to: "someone@example.com", body: FILLER });
// Resolves once the line is handed to the OS: a pipe takes 64 KiB at a time, and a worker's
// result is larger, so the process must not exit before then.
const emit = (kind, value) =>
  new Promise((resolve) =>
    process.stdout.write(
      value === undefined ? `${kind}\n` : `${kind} ${JSON.stringify(value)}\n`,
      resolve,
    ),
  );

// Warnings and errors only, to stderr (the harness keeps it as the child's log).
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[${level}] ${message}`);
});

const input = readline.createInterface({ input: process.stdin });
const queued = [];
const waiting = [];
input.on("line", (line) => (waiting.length ? waiting.shift()(line.trim()) : queued.push(line.trim())));
input.on("close", () => {
  queued.push("eof");
  while (waiting.length) waiting.shift()("eof");
});
const nextLine = () =>
  queued.length ? Promise.resolve(queued.shift()) : new Promise((resolve) => waiting.push(resolve));

async function publish(spec) {
  const job = JSON.parse(await nextLine());
  const utils = await makeWorkerUtils({ connectionString: spec.dsn, logger });
  await utils.withPgClient(async () => {}); // the pool's first connection, before "ready"
  emit("ready");
  if ((await nextLine()) !== "go") return utils.release();
  const { n, mode } = job;
  let accepted = 0;
  const start = now();
  if (mode === "single") {
    for (let seq = 0; seq < n; seq++) {
      await utils.addJob(TASK, payload(seq, now()));
      accepted++;
    }
  } else if (mode === "batch") {
    for (let first = 0; first < n; first += job.batch) {
      const sent = now();
      const specs = [];
      for (let seq = first; seq < Math.min(n, first + job.batch); seq++) {
        specs.push({ identifier: TASK, payload: payload(seq, sent) });
      }
      await utils.addJobs(specs);
      accepted += specs.length;
    }
  } else {
    // rate: each enqueue on its own schedule, at most `window` in flight
    const base = (job.index || 0) * 10_000_000;
    let inFlight = 0;
    let freed = null;
    const running = new Set();
    for (let i = 0; i < n; i++) {
      const delay = start + i / job.rate - now();
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay * 1000));
      while (inFlight >= job.window) await new Promise((resolve) => (freed = resolve));
      inFlight++;
      const p = utils.addJob(TASK, payload(base + i, now())).then(() => {
        accepted++;
        inFlight--;
        running.delete(p);
        if (freed) freed(), (freed = null);
      });
      running.add(p);
    }
    await Promise.all([...running]);
  }
  const end = now();
  await utils.release();
  await emit("result", { start, end, accepted });
}

async function work(spec) {
  const pool = new pg.Pool({ connectionString: spec.dsn, max: spec.concurrency + 2 });
  const clients = await Promise.all(Array.from({ length: 2 }, () => pool.connect()));
  clients.forEach((client) => client.release()); // connected before "ready"
  const seqs = [];
  const lat = [];
  let last = 0;
  emit("ready");
  if ((await nextLine()) !== "go") return pool.end();
  const runner = await run({
    pgPool: pool,
    concurrency: spec.concurrency,
    noHandleSignals: true,
    logger,
    taskList: {
      [TASK]: async (body) => {
        const at = now();
        seqs.push(body.seq);
        if (spec.latency) lat.push(at - body.sent);
        last = now();
      },
    },
    preset: {
      worker: { localQueue: { size: spec.local_queue }, completeJobBatchDelay: 0 },
    },
  });
  let failed = null;
  runner.promise.catch((error) => (failed = error));
  let shown = -1;
  const ticker = setInterval(() => {
    if (failed) emit("error", String(failed.stack)).then(() => process.exit(1));
    if (seqs.length !== shown) emit(`count ${(shown = seqs.length)}`);
  }, 20);
  await nextLine(); // "stop" (or the end of stdin)
  clearInterval(ticker);
  await runner.stop();
  await emit("result", { seqs, lat, last });
  await pool.end();
}

async function main() {
  const [command, arg] = process.argv.slice(2);
  if (command === "migrate") {
    await runMigrations({ connectionString: arg, logger });
    return;
  }
  const spec = JSON.parse(arg);
  await (spec.role === "publish" ? publish(spec) : work(spec));
}

main().then(
  () => process.exit(0),
  (error) => emit("error", String(error && error.stack)).then(() => process.exit(1)),
);
