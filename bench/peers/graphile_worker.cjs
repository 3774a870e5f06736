// graphile-worker peer (npm `graphile-worker`, 0.17.x: the last line that runs on Node 20).
// Run by graphile_peer.py: node graphile_worker.cjs <url> <jobs> <concurrency>
// with GRAPHILE_WORKER_MODULE pointing at the installed package.
// Settings: the docs' performance page (batching: localQueue, complete/fail
// batch delays 0) with concurrentJobs = C and maxPoolSize = C + 1.
"use strict";
const { performance } = require("node:perf_hooks");
const { makeWorkerUtils, run } = require(process.env.GRAPHILE_WORKER_MODULE || "graphile-worker");

const CHUNK = 1000;

async function main() {
  const [url, jobsArg, concurrencyArg] = process.argv.slice(2);
  const jobs = Number(jobsArg);
  const concurrency = Number(concurrencyArg);
  const utils = await makeWorkerUtils({ connectionString: url });
  let enqueueMs;
  try {
    await utils.migrate();
    const t0 = performance.now();
    for (let start = 0; start < jobs; start += CHUNK) {
      const specs = [];
      for (let i = start; i < Math.min(jobs, start + CHUNK); i++) {
        specs.push({ identifier: "noop", payload: { n: i } });
      }
      await utils.addJobs(specs);
    }
    enqueueMs = performance.now() - t0;
    if (process.env.ALK_BENCH_ANALYZE === "1") {
      // The planner's statistics before the worker starts (bench/peers/common.py, ANALYZE_ENV).
      await utils.withPgClient((client) => client.query("ANALYZE"));
    }
  } finally {
    await utils.release();
  }

  const settings = {
    concurrentJobs: concurrency,
    maxPoolSize: concurrency + 1,
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
    pollInterval: 2000,
  };
  let count = 0;
  let finished;
  let resolveDone;
  const done = new Promise((resolve) => (resolveDone = resolve));
  const started = performance.now();
  const runner = await run({
    connectionString: url,
    concurrency,
    noHandleSignals: true,
    pollInterval: settings.pollInterval,
    logger: undefined,
    preset: { worker: settings },
    taskList: {
      noop: async () => {
        count += 1;
        if (count === jobs) {
          finished = performance.now();
          resolveDone();
        }
      },
    },
  });
  await done;
  await runner.stop();
  const pkg = require(require("node:path").join(process.env.GRAPHILE_WORKER_MODULE, "package.json"));
  process.stdout.write(
    JSON.stringify({
      peer: "graphile-worker",
      version: pkg.version,
      jobs,
      concurrency,
      enqueue_s: enqueueMs / 1000,
      process_s: (finished - started) / 1000,
      processed: count,
      settings: { ...settings, node: process.version },
    }) + "\n",
  );
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
