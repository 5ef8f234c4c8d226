import threading
import time


def _prefetch():
    while True:
        time.sleep(0.05)


def slow_data_loader():
    while True:
        time.sleep(3600)  # line 12: the stuck rank


def train(rank):
    threading.Thread(target=_prefetch, daemon=True).start()
    if rank == 1:
        slow_data_loader()
    import select

    select.select([], [], [], 3600)


if __name__ == "__main__":
    import sys

    print("ready", flush=True)
    train(int(sys.argv[1]))
