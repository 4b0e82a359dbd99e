#!/usr/bin/env node
// sluice-check: one check from the command line, like `limiter check`.
// Prints the decision as JSON on stdout; exit status 0 admitted, 1 denied,
// 2 error (the error on stderr). With --identifier given more than once,
// every identifier is checked in one checks message (README, "Many checks
// in one message") and the results are printed as a JSON array; exit
// status 0 when every check was admitted, 1 when one was denied, 2 when
// one got an error. --window takes a calendar period (month,
// day@Europe/Berlin, ...) in place of --duration: a fixed window of the
// zone's calendar, whose reset is the period's end.

import { parseArgs } from "node:util";
import { connect } from "@nats-io/transport-node";
import {
  CALENDAR_UNITS,
  check,
  checks,
  DEFAULT_PREFIX,
  DEFAULT_TIMEOUT_MS,
  isCalendarPeriod,
  SluiceError,
  type Window,
  type WindowSpan,
} from "./sluice";

const EXIT_ADMITTED = 0;
const EXIT_DENIED = 1;
const EXIT_ERROR = 2;

const USAGE = `usage: sluice-check --workspace W --namespace N --identifier I --limit L
       [--duration 1m] [--window sliding|fixed|UNIT[@ZONE]]
       [--cost C] [--charge all|drain|debit]
       [--json] [--nats-url nats://127.0.0.1:4222]
       [--subject-prefix ratelimit] [--timeout 2s]
Durations are milliseconds or a number with ms, s, m, h or d. A calendar
--window (${CALENDAR_UNITS.join(", ")}, optionally @ and an IANA time zone:
month@America/New_York) is a fixed window of the zone's calendar that
resets when the period ends; it replaces --duration, which must then be
absent. Repeat --identifier to send every check in one checks message.`;

// parseDuration reads "1500", "1500ms", "10s", "1m", "2h" or "1d" as milliseconds.
function parseDuration(flag: string, text: string): number {
  const m = /^(\d+)(ms|s|m|h|d)?$/.exec(text);
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[m?.[2] ?? "ms"] ?? 1;
  const n = m ? Number(m[1]) * unit : Number.NaN;
  if (!Number.isSafeInteger(n)) {
    throw new UsageError(`--${flag} must be milliseconds or a number with ms, s, m, h or d, got ${JSON.stringify(text)}`);
  }
  return n;
}

// parseWindow reads --window: sliding, fixed, or a calendar period (its
// unit checked here, its zone by the limiter); undefined when absent.
function parseWindow(text: string | undefined): Window | undefined {
  if (text === undefined || text === "sliding" || text === "fixed" || isCalendarPeriod(text)) {
    return text;
  }
  throw new UsageError(
    `--window must be sliding, fixed or a calendar period (${CALENDAR_UNITS.join(", ")}, optionally @ and an IANA time zone), got ${JSON.stringify(text)}`,
  );
}

// parseInteger reads a decimal integer; ranges are the limiter's to check.
function parseInteger(flag: string, text: string): number {
  const n = /^-?\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(n)) {
    throw new UsageError(`--${flag} must be an integer, got ${JSON.stringify(text)}`);
  }
  return n;
}

// parseChoice reads one of choices, or undefined when the flag is absent.
function parseChoice<T extends string>(flag: string, text: string | undefined, choices: readonly T[]): T | undefined {
  if (text === undefined) {
    return undefined;
  }
  const c = choices.find((v) => v === text);
  if (c === undefined) {
    throw new UsageError(`--${flag} must be ${choices.join(", ")}, got ${JSON.stringify(text)}`);
  }
  return c;
}

class UsageError extends Error {}

async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      "nats-url": { type: "string", default: process.env.SLUICE_NATS_URL ?? "nats://127.0.0.1:4222" },
      "subject-prefix": { type: "string", default: process.env.SLUICE_SUBJECT_PREFIX ?? DEFAULT_PREFIX },
      workspace: { type: "string" },
      namespace: { type: "string" },
      identifier: { type: "string", multiple: true },
      limit: { type: "string" },
      duration: { type: "string" },
      cost: { type: "string" },
      window: { type: "string" },
      charge: { type: "string" },
      json: { type: "boolean", default: false },
      timeout: { type: "string", default: `${DEFAULT_TIMEOUT_MS}ms` },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return EXIT_ADMITTED;
  }
  const { workspace, namespace, identifier, limit } = values;
  if (workspace === undefined || namespace === undefined || identifier === undefined || limit === undefined) {
    throw new UsageError("--workspace, --namespace, --identifier and --limit are required");
  }
  // A calendar period is the window: no duration goes with it. Otherwise
  // --duration, one minute when absent.
  const window = parseWindow(values.window);
  let span: WindowSpan;
  if (window !== undefined && isCalendarPeriod(window)) {
    if (values.duration !== undefined) {
      throw new UsageError(`--duration must be absent with a calendar --window (${window}): the period is the window`);
    }
    span = { window };
  } else {
    span = { duration: parseDuration("duration", values.duration ?? "1m"), window };
  }
  const req = {
    workspace,
    namespace,
    identifier: identifier[0] ?? "",
    limit: parseInteger("limit", limit),
    cost: values.cost === undefined ? undefined : parseInteger("cost", values.cost),
    charge: parseChoice("charge", values.charge, ["all", "drain", "debit"] as const),
    ...span,
  };
  const timeoutMs = parseDuration("timeout", values.timeout);
  const nc = await connect({ servers: values["nats-url"].split(","), maxReconnectAttempts: 0 });
  try {
    if (identifier.length > 1) {
      const results = await checks(
        nc,
        workspace,
        identifier.map((id) => ({
          namespace,
          identifier: id,
          limit: req.limit,
          cost: req.cost,
          charge: req.charge,
          ...span,
        })),
        { ...(values.json ? { encoding: "json" as const } : {}), prefix: values["subject-prefix"], timeoutMs },
      );
      console.log(JSON.stringify(results));
      if (results.some((r) => "error" in r)) {
        return EXIT_ERROR;
      }
      return results.every((r) => "success" in r && r.success) ? EXIT_ADMITTED : EXIT_DENIED;
    }
    // Without --json, check's default encoding: msgpack.
    const resp = await check(nc, req, {
      ...(values.json ? { encoding: "json" as const } : {}),
      prefix: values["subject-prefix"],
      timeoutMs,
    });
    console.log(JSON.stringify(resp));
    return resp.success ? EXIT_ADMITTED : EXIT_DENIED;
  } finally {
    await nc.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const code = typeof err === "object" && err !== null ? String((err as { code?: unknown }).code) : "";
    if (err instanceof UsageError || code.startsWith("ERR_PARSE_ARGS")) {
      console.error(`sluice-check: ${(err as Error).message}\n${USAGE}`);
    } else if (err instanceof SluiceError) {
      console.error(`sluice-check: ${err.code} ${err.description}`);
    } else {
      console.error(`sluice-check: ${err instanceof Error ? err.message : String(err)}`);
    }
    process.exitCode = EXIT_ERROR;
  },
);
