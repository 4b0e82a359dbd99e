// A client of Sluice's check contract (README, "Ask for a check" and "Many checks in one message"): one
// NATS request to <prefix>.check.<workspace>.<namespace> with a msgpack
// (default) or JSON body, answered by a limiter with a decision or a `micro`
// service error; or many independent checks of one workspace in one request
// to <prefix>.checks.<workspace>, answered with a result per check. It
// depends only on the wire contract, not on the Go client.

import { decode, encode } from "@msgpack/msgpack";
import { headers, type Msg, type NatsConnection } from "@nats-io/transport-node";

/** The subject prefix limiters serve by default (`--subject-prefix`). */
export const DEFAULT_PREFIX = "ratelimit";

/** How long check waits for a reply unless told otherwise, in milliseconds. */
export const DEFAULT_TIMEOUT_MS = 2000;

/** Body encodings of the contract; the reply comes back in the request's. */
export type Encoding = "msgpack" | "json";

/**
 * One check: may `identifier` of `workspace`/`namespace` spend `cost` against
 * `limit` per window? The window is `duration` milliseconds (sliding or
 * fixed), or a calendar period named by `window`, which then stands in for
 * `duration`. Ranges are the limiter's to enforce: out-of-range values come
 * back as a SluiceError with code 400.
 */
export type CheckRequest = {
  /** Subject token: 1–64 characters of [A-Za-z0-9_-]. */
  workspace: string;
  /** Subject token: 1–64 characters of [A-Za-z0-9_-]. */
  namespace: string;
} & CheckFields &
  WindowSpan;

/** The fields of a check that are neither its subject nor its window. */
export interface CheckFields {
  /** 1–512 bytes of UTF-8. */
  identifier: string;
  /** 0 ≤ limit ≤ 10^15 per window; 0 denies every request of cost > 0. */
  limit: number;
  /** 0 ≤ cost ≤ 10^15; omitted means 1 (the limiter's default); 0 only looks. */
  cost?: number;
  /** How cost is charged; omitted means "all" (whole or nothing). "debit" charges usage known afterwards, even past the limit. */
  charge?: Charge;
}

/**
 * The window of a check: a length in milliseconds, or a calendar period.
 * Exactly one of the two: `duration` is required unless `window` is a
 * calendar period, and must be absent when it is one.
 */
export type WindowSpan = DurationWindow | CalendarWindow;

/** A window of `duration` milliseconds, sliding (the default) or fixed. */
export interface DurationWindow {
  /** Window length in milliseconds, 1000 ≤ duration ≤ 31,622,400,000 (366 days). */
  duration: number;
  /** "fixed": the window's own count alone, the whole limit back at its end; omitted means "sliding". */
  window?: "sliding" | "fixed";
}

/** A calendar period as the window: the period is the window, so no duration. */
export interface CalendarWindow {
  /** The period, e.g. "month@America/New_York"; see CalendarPeriod. */
  window: CalendarPeriod;
  /** Absent: the limiter refuses a duration beside a calendar period (and check refuses it before sending). */
  duration?: undefined;
}

/** The units of a calendar period, as a `window` names them. */
export const CALENDAR_UNITS = ["minute", "hour", "day", "week", "month", "year"] as const;

/** A calendar period's unit; a week is ISO 8601's, Monday to Sunday. */
export type CalendarUnit = (typeof CALENDAR_UNITS)[number];

/**
 * A calendar period: a fixed window aligned to a time zone's calendar,
 * written `<unit>` (UTC) or `<unit>@<IANA zone>` ("day@Europe/Berlin",
 * "month@America/New_York"). Each period counts alone, from zero; the whole
 * limit comes back when it ends, and `reset` and `retry_after` are that end
 * (a "month@America/New_York" quota renews at midnight of the 1st, New York
 * time). An hour counts from the zone's midnight; a day, week, month or year
 * begins at the zone's midnight. The unit is checked before sending; the
 * zone is the limiter's to check (an unknown one is a SluiceError 400).
 */
export type CalendarPeriod = CalendarUnit | `${CalendarUnit}@${string}`;

/**
 * The kind of window a check counts in: "sliding" (the default: the
 * previous window's count weighs in proportion to its overlap), "fixed"
 * (the window's own count alone, the whole limit back at its end), or a
 * calendar period (a fixed window of the zone's calendar; see
 * CalendarPeriod).
 */
export type Window = "sliding" | "fixed" | CalendarPeriod;

/** How a calendar period is written, as the errors say. */
const CALENDAR_RULE =
  "minute, hour, day, week, month or year, optionally followed by @ and an IANA time zone (month@Europe/Berlin)";

/**
 * Reports whether window w is written as a calendar period: a unit of
 * CALENDAR_UNITS, alone or followed by "@" and a zone. The zone is not
 * checked here: the limiter checks it against its IANA table.
 */
export function isCalendarPeriod(w: string): w is CalendarPeriod {
  const at = w.indexOf("@");
  const unit = at < 0 ? w : w.slice(0, at);
  return (CALENDAR_UNITS as readonly string[]).includes(unit);
}

/** How a check's cost is charged: whole or nothing, what is left when it does not fit, or whatever the room. */
export type Charge = "all" | "drain" | "debit";

/** A decision, as the limiter sent it. A denial is a decision, not an error. */
export interface CheckResponse {
  /** True when the request was admitted and its cost counted. */
  success: boolean;
  /** The limit applied. */
  limit: number;
  /** How much more cost would be admitted now (≥ 0). */
  remaining: number;
  /** Unix milliseconds at which the current fixed window ends. */
  reset: number;
  /** Milliseconds until a request of this cost would be admitted if nothing else arrives; 0 when admitted. */
  retry_after: number;
  /** True when shadow mode admitted a check the limit would deny (`success` is then true); absent otherwise. */
  shadow_denied?: boolean;
  /** The override pattern that applied (for example "user_*"); absent when none did. */
  override?: string;
}

/** Options of check; every one has a default. */
export interface CheckOptions {
  /** Body encoding; default "msgpack", as the Go client. */
  encoding?: Encoding;
  /** Subject prefix; default DEFAULT_PREFIX. */
  prefix?: string;
  /** Reply timeout in milliseconds; default DEFAULT_TIMEOUT_MS. */
  timeoutMs?: number;
}

/**
 * An error reply of a limiter (`Nats-Service-Error-Code` and
 * `Nats-Service-Error` headers): 400 for bad input (nothing was counted),
 * 500 for an internal fault, 503 while the limiter shuts down.
 */
export class SluiceError extends Error {
  constructor(
    /** The Nats-Service-Error-Code, e.g. 400. */
    readonly code: number,
    /** What is wrong, as the limiter said it. */
    readonly description: string,
  ) {
    super(`sluice: ${code} ${description}`);
    this.name = "SluiceError";
  }
}

const TOKEN = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * Asks a limiter for a decision. Resolves with the decision, admitted or
 * denied; rejects with a SluiceError when a limiter answers with an error,
 * with a TypeError before sending when workspace or namespace is not a
 * subject token (so a request can never reach another tenant's subject) or
 * when the window is malformed (a window that is not sliding, fixed or a
 * calendar unit; a duration beside a calendar period; neither a duration
 * nor a calendar period), and with the nats.js error when no limiter
 * answers in time or none listens.
 */
export async function check(
  nc: NatsConnection,
  req: CheckRequest,
  opts: CheckOptions = {},
): Promise<CheckResponse> {
  for (const [name, value] of [["workspace", req.workspace], ["namespace", req.namespace]] as const) {
    if (!TOKEN.test(value)) {
      throw new TypeError(`${name} must be 1 to 64 characters of [A-Za-z0-9_-], got ${JSON.stringify(value)}`);
    }
  }
  const encoding = opts.encoding ?? "msgpack";
  const body = checkBody(req, {}, "");
  const h = headers();
  let payload: Uint8Array;
  if (encoding === "json") {
    h.set("Content-Type", "application/json");
    payload = new TextEncoder().encode(JSON.stringify(body));
  } else {
    h.set("Content-Type", "application/msgpack");
    payload = encode(body);
  }
  const subject = `${opts.prefix ?? DEFAULT_PREFIX}.check.${req.workspace}.${req.namespace}`;
  const reply = await nc.request(subject, payload, {
    timeout: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    headers: h,
  });
  const code = reply.headers?.get("Nats-Service-Error-Code") ?? "";
  if (code !== "") {
    throw new SluiceError(Number.parseInt(code, 10) || 500, errorDescription(encoding, reply));
  }
  const decoded = decodeBody(encoding, reply.data);
  return decision(decoded);
}

// checkBody adds the keys of check c to body, in the contract's order
// (identifier, limit, duration, cost, window, charge), and returns it. A
// calendar period goes in "window" with no "duration" key. It throws a
// TypeError, prefixed with where, for a window that is neither sliding,
// fixed nor a calendar unit, for a duration beside a calendar period, and
// for a check with neither: none of them could be decided. The values are
// read as unknown: a JavaScript caller may send anything.
function checkBody(
  c: CheckFields & WindowSpan,
  body: Record<string, string | number>,
  where: string,
): Record<string, string | number> {
  const w: unknown = c.window;
  const d: unknown = c.duration;
  const calendar = typeof w === "string" && isCalendarPeriod(w);
  if (w !== undefined && w !== "sliding" && w !== "fixed" && !calendar) {
    throw new TypeError(`${where}window must be sliding, fixed or a calendar period: ${CALENDAR_RULE}; got ${JSON.stringify(w)}`);
  }
  if (calendar && d !== undefined) {
    throw new TypeError(`${where}duration must be absent with a calendar window (${String(w)}): the period is the window`);
  }
  if (!calendar && d === undefined) {
    throw new TypeError(`${where}duration is required unless window is a calendar period: ${CALENDAR_RULE}`);
  }
  body.identifier = c.identifier;
  body.limit = c.limit;
  if (!calendar) {
    body.duration = d as number;
  }
  if (c.cost !== undefined) {
    body.cost = c.cost;
  }
  if (w !== undefined) {
    body.window = w as Window;
  }
  if (c.charge !== undefined) {
    body.charge = c.charge;
  }
  return body;
}

// decision reads a decision body: the five fields it always carries, and
// shadow_denied and override when present.
function decision(body: unknown): CheckResponse {
  const d: CheckResponse = {
    success: field(body, "success", "boolean"),
    limit: field(body, "limit", "number"),
    remaining: field(body, "remaining", "number"),
    reset: field(body, "reset", "number"),
    retry_after: field(body, "retry_after", "number"),
  };
  const shadow = optionalField(body, "shadow_denied", "boolean");
  if (shadow !== undefined) d.shadow_denied = shadow;
  const override = optionalField(body, "override", "string");
  if (override !== undefined) d.override = override;
  return d;
}

function decodeBody(encoding: Encoding, data: Uint8Array): unknown {
  try {
    return encoding === "json" ? JSON.parse(new TextDecoder().decode(data)) : decode(data);
  } catch (err) {
    throw new Error(`sluice: invalid reply: not ${encoding}`, { cause: err });
  }
}

// errorDescription is what an error reply says is wrong: its
// Nats-Service-Error header, else the body's "error" field.
function errorDescription(encoding: Encoding, reply: Msg): string {
  const header = reply.headers?.get("Nats-Service-Error") ?? "";
  if (header !== "") {
    return header;
  }
  try {
    return field(decodeBody(encoding, reply.data), "error", "string");
  } catch {
    return "(no description)";
  }
}

type Kinds = { boolean: boolean; number: number; string: string };

// field returns body[name] when it has the type the contract gives it, and
// throws otherwise: a reply that breaks the contract is an error, never a
// decision made of undefined.
function field<K extends keyof Kinds>(body: unknown, name: string, kind: K): Kinds[K] {
  const v = typeof body === "object" && body !== null ? (body as Record<string, unknown>)[name] : undefined;
  if (typeof v !== kind) {
    throw new Error(`sluice: invalid reply: ${name} is ${v === undefined ? "missing" : typeof v}, want ${kind}`);
  }
  return v as Kinds[K];
}

// optionalField is field for a member the reply may omit: undefined when
// absent, an error when present with another type.
function optionalField<K extends keyof Kinds>(body: unknown, name: string, kind: K): Kinds[K] | undefined {
  const v = typeof body === "object" && body !== null ? (body as Record<string, unknown>)[name] : undefined;
  return v === undefined ? undefined : field(body, name, kind);
}

/** One check of a checks message: its namespace and its fields, as CheckRequest's. */
export type Check = {
  /** Subject token: 1–64 characters of [A-Za-z0-9_-]; checked by the limiter. */
  namespace: string;
} & CheckFields &
  WindowSpan;

/**
 * What the limiter said about one check of a checks message: a decision, or
 * an error for this check alone (nothing was counted for it): code 400 when
 * its fields are bad, 503 when the limiter stopped before deciding it (send
 * it again), 500 for an internal fault.
 */
export type CheckResult = CheckResponse | { error: string; code: number };

/** The most checks one checks message may carry. */
export const MAX_CHECKS = 1000;

/**
 * Sends many independent checks of one workspace in one message
 * (`<prefix>.checks.<workspace>`, README "Many checks in one message") and resolves with one
 * result per check, in order. Each check is decided exactly as if it had
 * been sent alone: a denial or a bad field of one changes nothing for the
 * others. Rejects with a SluiceError when the limiter refuses the message as
 * a whole (not readable, no checks, more than MAX_CHECKS), with a TypeError
 * before sending for a workspace that is not a subject token, a count out
 * of range, or a check whose window is malformed as check says (the error
 * names it, "checks[i]: ..."; nothing is sent), and with the nats.js error
 * when no limiter answers in time.
 *
 * This is how a client coalesces: many callers' checks, waiting at the same
 * moment, leave in one message, and the NATS cost of a message is shared.
 */
export async function checks(
  nc: NatsConnection,
  workspace: string,
  list: Check[],
  opts: CheckOptions = {},
): Promise<CheckResult[]> {
  if (!TOKEN.test(workspace)) {
    throw new TypeError(`workspace must be 1 to 64 characters of [A-Za-z0-9_-], got ${JSON.stringify(workspace)}`);
  }
  if (list.length < 1 || list.length > MAX_CHECKS) {
    throw new TypeError(`checks must hold 1 to ${MAX_CHECKS} checks, got ${list.length}`);
  }
  const encoding = opts.encoding ?? "msgpack";
  const body = {
    checks: list.map((c, i) => checkBody(c, { namespace: c.namespace }, `checks[${i}]: `)),
  };
  const h = headers();
  let payload: Uint8Array;
  if (encoding === "json") {
    h.set("Content-Type", "application/json");
    payload = new TextEncoder().encode(JSON.stringify(body));
  } else {
    h.set("Content-Type", "application/msgpack");
    payload = encode(body);
  }
  const reply = await nc.request(`${opts.prefix ?? DEFAULT_PREFIX}.checks.${workspace}`, payload, {
    timeout: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    headers: h,
  });
  const code = reply.headers?.get("Nats-Service-Error-Code") ?? "";
  if (code !== "") {
    throw new SluiceError(Number.parseInt(code, 10) || 500, errorDescription(encoding, reply));
  }
  const decoded = decodeBody(encoding, reply.data);
  const results = typeof decoded === "object" && decoded !== null ? (decoded as { results?: unknown }).results : undefined;
  if (!Array.isArray(results) || results.length !== list.length) {
    throw new Error(`sluice: invalid reply: want results for ${list.length} checks`);
  }
  return results.map((r: unknown): CheckResult => {
    if (typeof r === "object" && r !== null && "error" in r) {
      const c = (r as { code?: unknown }).code;
      return { error: field(r, "error", "string"), code: typeof c === "number" ? c : 400 };
    }
    return decision(r);
  });
}
