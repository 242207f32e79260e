"""Take docs/dashboard.png and docs/dashboard-phone.png: the dashboard of a broker with
some realistic traffic, 1400 px wide and 420 px wide (a phone).

    .venv/bin/python scripts/screenshot.py [--seconds 50] [--out docs/dashboard.png]
        [--phone-out docs/dashboard-phone.png]

Starts an in-memory broker in this process, runs a few publishers and workers through
the SDK (steady mail, bursty thumbnails with some retries, billing with dead letters,
slow transcodes that report progress, each after its poster frame, a backlog of reports
paused part way), lets the charts fill for ``--seconds``, then opens the page in
Debian's Chromium (see ../shared/browser-testing.md), opens a queue (its job browser, two
jobs ticked), a worker and its longest-running transcode (a progress bar, the job it
waited for), and saves a full-page screenshot at each width. Needs /usr/bin/chromium and
the playwright package (never ``playwright install``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conveyor.broker.config import Config  # noqa: E402
from conveyor.broker.engine import QueueOpts  # noqa: E402
from conveyor.broker.server import Broker, running_broker  # noqa: E402
from conveyor.sdk import Client, Fail, Job, Retry, Worker  # noqa: E402

if TYPE_CHECKING:
    from playwright.async_api import Browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


async def publish(client: Client, stop: asyncio.Event) -> None:
    """Steady mail with a slow swell, bursts of thumbnails, a trickle of invoices, and
    now and then a transcode that waits for its video's poster frame (a thumbnail)."""
    rng = random.Random(7)
    started = time.monotonic()
    tick = 0
    poster: list[str] = []
    while not stop.is_set():
        elapsed = time.monotonic() - started
        mails = max(1, round(6 + 4 * math.sin(elapsed / 9)))
        await client.enqueue_many(
            "emails",
            [{"to": f"user{rng.randrange(10_000)}@example.com", "template": "receipt"}] * mails,
        )
        if tick % 40 < 6:  # a burst every 10 s
            poster = await client.enqueue_many(
                "thumbnails",
                [{"image": f"s3://uploads/{rng.randrange(10**6):06d}.jpg", "size": 256}] * 8,
            )
        if tick % 24 == 0:  # a transcode every 6 s, once a poster frame is made
            await client.enqueue(
                "transcodes",
                {"video": f"s3://uploads/{rng.randrange(10**6):06d}.mp4", "to": "720p"},
                visibility_timeout_s=600,
                after=poster[:1],
            )
        if tick % 3 == 0:
            await client.enqueue(
                "billing",
                {
                    "invoice": f"INV-{rng.randrange(10**5):05d}",
                    "amount": rng.randrange(500, 90_000),
                },
                max_attempts=2,
                backoff_base_s=0.5,
            )
        tick += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def workers(url: str) -> list[Worker]:
    rng = random.Random(11)
    mailer = Worker(url, queues=[], worker_id="mailer-7f3c", prefetch=8, shutdown_timeout_s=2)
    imaging = Worker(url, queues=[], worker_id="imaging-02a1", prefetch=4, shutdown_timeout_s=2)
    payments = Worker(url, queues=[], worker_id="payments-91be", prefetch=2, shutdown_timeout_s=2)
    video = Worker(url, queues=[], worker_id="video-5d10", prefetch=3, shutdown_timeout_s=2)
    reporter = Worker(url, queues=[], worker_id="reports-33d0", prefetch=1, shutdown_timeout_s=2)

    @mailer.handler("emails")
    async def send(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.02, 0.2))

    @imaging.handler("thumbnails")
    async def resize(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.15, 0.45))
        if rng.random() < 0.12:
            raise Retry(delay_s=1.0, error="OSError: image store busy")

    @payments.handler("billing")
    async def charge(job: Job) -> None:
        await asyncio.sleep(rng.uniform(0.05, 0.3))
        roll = rng.random()
        if roll < 0.08:
            raise Fail("card declined: insufficient funds")
        if roll < 0.16:
            raise Retry(error="TimeoutError: payment gateway did not answer within 30 s")

    @video.handler("transcodes")
    async def transcode(job: Job) -> None:
        step = rng.uniform(20, 90) / 50
        for done in range(1, 51):
            await asyncio.sleep(step)
            await job.progress(done / 50, f"encoding {job.payload['to']}")

    @reporter.handler("reports")
    async def report(job: Job) -> dict[str, object]:  # its result, kept an hour
        await asyncio.sleep(rng.uniform(0.6, 1.4))
        team = job.payload["team"]
        return {"pages": rng.randint(3, 40), "url": f"https://files.example.com/{team}.pdf"}

    return [mailer, imaging, payments, video, reporter]


@contextlib.asynccontextmanager
async def traffic(broker: Broker) -> AsyncIterator[Client]:
    stop = asyncio.Event()
    async with Client(broker.url) as client:
        # A backlog of reports, worked through slowly (the queue is paused before the
        # shot, with what is left), and some scheduled work.
        await client.enqueue_many(
            "reports", [{"report": "weekly", "team": f"team-{n:02d}"} for n in range(90)]
        )
        await client.enqueue_many(
            "webhooks", [{"hook": f"https://hooks.example.com/{n}"} for n in range(5)], delay_s=900
        )
        # Schedules: a nightly report in Paris, a cleanup every five minutes, a heartbeat
        # of every 10 s that fires during the run, and one paused.
        await client.set_schedule(
            "nightly-report", "reports", {"report": "daily"}, cron="30 2 * * *", tz="Europe/Paris"
        )
        await client.set_schedule("cleanup", "maintenance", {"older_than_days": 30}, every_s=300)
        await client.set_schedule("heartbeat", "emails", {"to": "ops@example.com"}, every_s=10)
        await client.set_schedule(
            "quarterly-billing", "billing", {"run": "quarter"}, cron="0 6 1 */3 *", paused=True
        )
        running = [asyncio.create_task(w.run()) for w in workers(broker.url)]
        publisher = asyncio.create_task(publish(client, stop))
        try:
            yield client
        finally:
            stop.set()
            await publisher
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


async def shot(browser: Browser, url: str, width: int, out: str) -> None:
    """The dashboard at ``url`` in a ``width`` px window, a queue (its jobs listed), a
    worker and its longest-running job opened, saved whole to ``out``."""
    from playwright.async_api import expect

    page = await browser.new_page(viewport={"width": width, "height": 900})
    await page.goto(url)
    await expect(page.get_by_test_id("conn-state")).to_have_attribute("data-state", "live")
    # The paused reports queue's backlog in the job browser, two of its jobs ticked.
    await page.get_by_test_id("open-queue-reports").click()
    body = page.get_by_test_id("jobs-body")
    await expect(body.locator("tr")).to_have_count(20)
    for row in (await body.locator("tr").all())[1:3]:
        await row.locator('input[type="checkbox"]').check()
    await page.get_by_test_id("open-worker-video-5d10").click()
    held = page.locator('[data-testid^="held-row-"]')
    await expect(held.first).to_be_visible()
    await expect(page.locator('[data-testid^="dead-row-"]').first).to_be_visible(timeout=10_000)
    # Its longest-running transcode in the job view: its progress bar, the poster frame
    # it waited for.
    job_id = await held.first.get_attribute("data-job")
    assert job_id is not None
    await page.get_by_test_id("job-input").fill(job_id)
    await page.get_by_test_id("job-submit").click()
    await expect(page.get_by_test_id("job-progress")).to_be_visible()
    await page.evaluate("window.scrollTo(0, 0)")
    await page.mouse.move(0, 0)  # no hover highlight in the picture
    await page.wait_for_timeout(600)  # one more snapshot, smooth scrolling settled
    overflow = await page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    if overflow > 0:
        sys.exit(f"at {width} px the page is {overflow} px wider than the window")
    await page.screenshot(path=out, full_page=True)
    await page.close()


async def shoot(args: argparse.Namespace) -> None:
    from playwright.async_api import async_playwright

    config = Config(
        port=0,
        store="memory",
        sweep_interval_s=1.0,
        disconnect_grace_s=0.0,
        # Finished reports keep their results an hour; finished thumbnails are kept so
        # that a transcode may still name its poster frame after it is done.
        queue_opts={
            "reports": QueueOpts(completed_retention_s=3600.0),
            "thumbnails": QueueOpts(completed_retention_s=600.0),
        },
    )
    async with running_broker(config) as broker, traffic(broker) as client:
        await asyncio.sleep(args.seconds * 0.7)
        await client.pause("reports")
        await asyncio.sleep(args.seconds * 0.3)
        url = broker.url.replace("ws://", "http://").removesuffix("/ws") + "/"
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            await shot(browser, url, 1400, args.out)
            await shot(browser, url, 420, args.phone_out)
            await browser.close()
        stats = await client.stats()
    dead = ", ".join(f"{name}: {counts['dead']} dead" for name, counts in stats.items())
    print(f"wrote {args.out} and {args.phone_out} ({dead})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=50.0, help="traffic before the shot")
    parser.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    parser.add_argument("--phone-out", default=str(ROOT / "docs" / "dashboard-phone.png"))
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    asyncio.run(shoot(args))


if __name__ == "__main__":
    main()
